"""Reading what the reference exporter writes: torch_to_nnef archives (tests/fixtures/t2n)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import torchlower
from tests.test_cli import cli, cli_json

HERE = Path(__file__).resolve().parent / "fixtures" / "t2n"
FAMILIES = ["lstm", "gru", "encoder", "encoder_dynamic", "cnn", "quantized"]


def _arrays(family: str, kind: str) -> dict[str, np.ndarray]:
    with np.load(HERE / f"{family}.{kind}.npz") as data:
        return {k: data[k] for k in data.files}


@pytest.mark.parametrize("family", FAMILIES)
def test_load_inspect_and_run_match_pytorch(family: str) -> None:
    path = HERE / f"{family}.nnef.tgz"
    info = torchlower.inspect(path)
    assert "tract_core_properties" in info["fragments"]
    expected = _arrays(family, "expected")["output_0"]
    out = info["outputs"][0]
    assert out["dtype"] == "float32" and len(out["shape"]) == expected.ndim
    with torchlower.load(path) as art:
        got = art.run(_arrays(family, "inputs"))["output_0"]
    # the quantized archive is compared within one quantization step of its output (0.0109)
    tolerance = 0.011 if family == "quantized" else 1e-5
    assert got.shape == expected.shape and np.abs(got - expected).max() <= tolerance


def test_structures_other_exporters_use_are_parsed() -> None:
    lstm = torchlower.load(HERE / "lstm.nnef.tgz").graph
    assert any(len(a.outputs) > 1 for a in lstm.assignments), "tuple results a, b = op(...)"
    assert {"lstm", "lstm_scan_loop"} <= set(lstm.fragments)
    encoder = torchlower.load(HERE / "encoder_dynamic.nnef.tgz").graph
    assert encoder.reassigned, "torch_to_nnef assigns some shape names twice"
    assert torchlower.load(HERE / "quantized.nnef.tgz").quant is not None


def test_dynamic_encoder_runs_at_another_length() -> None:
    """The symbolic S takes its size from the input; PyTorch rebuilt from the seed agrees."""
    sys.path.insert(0, str(HERE))
    try:
        from make_fixtures import encoder
    finally:
        sys.path.remove(str(HERE))
    torch.manual_seed(0)
    model = encoder().eval()
    x = np.random.default_rng(5).standard_normal((1, 9, 8)).astype(np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    with torchlower.load(HERE / "encoder_dynamic.nnef.tgz") as art:
        got = art.run([x])["output_0"]
    assert got.shape == (1, 9, 8) and np.abs(got - want).max() < 1e-5
    data = cli_json("inspect", HERE / "encoder_dynamic.nnef.tgz")
    assert data["outputs"] == [{"name": "output_0", "shape": [1, "S", 8], "dtype": "float32"}]


@pytest.mark.parametrize("family", ["lstm", "encoder"])
def test_cli_reads_the_reference_lstm_and_transformer(family: str, tmp_path: Path) -> None:
    path = HERE / f"{family}.nnef.tgz"
    inputs, expected = HERE / f"{family}.inputs.npz", HERE / f"{family}.expected.npz"
    checked = cli_json("check", path, "--inputs", inputs, "--expected", expected)
    assert checked["compared"][0]["ok"] and checked["max_abs_error"] < 1e-5
    ran = cli_json("run", path, "--inputs", inputs, "--out", tmp_path / "out.npz")
    assert ran["outputs"][0]["shape"] == list(_arrays(family, "expected")["output_0"].shape)
    text = cli("inspect", path)
    assert text.returncode == 0 and "output output_0" in text.stdout, text.stderr

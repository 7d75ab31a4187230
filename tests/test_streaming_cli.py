"""The streaming CLI (issue 29): ``export --stream``, ``inspect``, ``check --stream`` at another
pulse and ``run --stream`` in subprocesses, in tract's real pulse transform."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from tests.streaming_models import CausalTCN, ConvTasNet, STFTDenoiser, model_of

ROOT = Path(__file__).resolve().parents[1]


MODELS_PY = """
from tests.streaming_models import CausalTCN, ConvTasNet, STFTDenoiser, model_of

def tcn():
    return model_of(CausalTCN)

def tasnet():
    return model_of(ConvTasNet)

def stft_denoiser():
    return model_of(STFTDenoiser)
"""

# factory, example, streaming axis, streamed input, pulses (export, check, run), delay, output steps
# compared (the denoiser's last 48 samples: PyTorch's whole-input istft has fewer frames there)
CLI_CASES = [
    ("tcn", CausalTCN, "x:1x4x64", 2, (1, 4, 100), ("16", "24", "32"), 0, 100),
    ("tasnet", ConvTasNet, "x:1x1x256", 2, (1, 1, 300), ("64", "16", "32"), 19, 260),
    ("stft_denoiser", STFTDenoiser, "x:1x512", 1, (1, 300), ("64", "32", "160"), 48, 240),
]


@pytest.mark.parametrize(("name", "factory", "example", "axis", "shape", "pulses", "delay", "compared"),
                         CLI_CASES, ids=[c[0] for c in CLI_CASES])  # fmt: skip
def test_cli_export_check_run_inspect(
    tmp_path: Path, name: str, factory: type[nn.Module], example: str, axis: int, shape: tuple[int, ...],
    pulses: tuple[str, str, str], delay: int, compared: int,
) -> None:  # fmt: skip
    (tmp_path / "zoo_models.py").write_text(MODELS_PY)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))

    def cli(*args: str) -> dict:
        proc = subprocess.run(
            [sys.executable, "-m", "torchlower", *args, "--json"], capture_output=True, text=True, env=env,
            cwd=tmp_path, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr + proc.stdout
        return json.loads(proc.stdout)

    exported = cli(
        "export", f"zoo_models:{name}", "--input", example, "--dynamic", f"x:{axis}=T", "-o", "t.nnef.tgz",
        "--stream", f"T={pulses[0]}",
    )  # fmt: skip
    assert exported["stream"]["pulse"] == int(pulses[0]) and exported["stream"]["delay"] == delay
    assert exported["stream"]["max_abs_error"] <= 1e-5
    shown = cli("inspect", "t.nnef.tgz", "--no-shapes")["streaming"]
    assert shown["pulse"] == int(pulses[0]) and shown["delay"] == delay
    checked = cli("check", "t.nnef.tgz", "--stream", f"T={pulses[1]}", "--model", f"zoo_models:{name}")
    assert checked["stream"]["pulse"] == int(pulses[1]) and checked["stream"]["max_abs_error"] <= 1e-5
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    ran = cli("run", "t.nnef.tgz", "--stream", f"T={pulses[2]}", "--inputs", "in.npz", "--out", "out.npz")
    assert ran["delay"] == delay and ran["real_time_factor"] > 0
    with np.load(tmp_path / "out.npz") as data:
        got = data["output"]
    want = model_of(factory)(torch.from_numpy(x)).detach().numpy()
    assert got.shape[axis] == shape[axis]  # the steps the input covers, delay dropped
    head = np.arange(compared)
    assert np.abs(np.take(got, head, axis) - np.take(want, head, axis)).max() < 1e-5

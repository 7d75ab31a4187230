"""The streaming zoo (issue 29) through the CLI and the API, in tract's real pulse transform.

Every zoo model (tests/streaming_models.py; its torchaudio MFCC and mel front ends are the real
package models; torchaudio's Wav2Letter streams through the API in test_streaming.py) goes through
``export --stream`` (three input lengths at the export pulse), ``inspect``, ``check --stream`` at a
second pulse against ``--model`` (three lengths again), ``run --stream --inputs --out --json`` and
``torchlower.load(...).stream(..., isolated=False).run`` (two more lengths). The CLI runs in this
process (``torchlower.cli.main``: a subprocess per command costs its imports); one subprocess test
keeps ``python -m torchlower`` honest. Besides the library's own streaming check, the test compares
every streamed output itself, whole and delay-aligned, with PyTorch."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import torchlower
from tests.streaming_models import ZOO, Case, model_of
from torchlower.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
SCALE_TOLERANCE = 1e-5  # of the output scale (max(1, |PyTorch output|)), as the issue asks


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    code = main([*args, "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err[-3000:]
    return json.loads(out.out)


def reference(model: torch.nn.Module, x: np.ndarray, axis: int, fed: int) -> np.ndarray:
    """PyTorch on the signal the stream saw: ``x`` and the zeros pushed after it (``fed`` steps)."""
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, fed - x.shape[axis])
    with torch.no_grad():
        return model(torch.from_numpy(np.pad(x, widths))).numpy()


def assert_whole_stream(
    model: torch.nn.Module, x: np.ndarray, case: Case, got: np.ndarray, out_axis: int, fed: int
) -> float:
    """``got`` (a delay-aligned streamed output) has the steps ``x`` covers (one per ``stride``
    input steps, at least PyTorch's on ``x`` alone) and equals PyTorch on every one of them; the
    error relative to the output scale."""
    with torch.no_grad():
        alone = model(torch.from_numpy(x)).numpy()
    want_all = reference(model, x, case.axis, fed)
    n = got.shape[out_axis]
    assert n == -(-x.shape[case.axis] // case.stride), (x.shape, got.shape)
    assert alone.shape[out_axis] <= n <= want_all.shape[out_axis], (alone.shape, got.shape, want_all.shape)
    want = np.take(want_all, np.arange(n), axis=out_axis)
    assert got.shape == want.shape
    scale = max(1.0, float(np.abs(want).max()))
    error = float(np.abs(got - want).max()) / scale
    assert error <= SCALE_TOLERANCE, f"streamed output differs from PyTorch: {error:.3g} of the scale"
    return error


def assert_points(stream: dict[str, Any], pulse: int, delay: int) -> None:
    """A stream report of the library's check: the pulse and delay, three lengths, every output
    within 1e-5 of its scale (the JSON tolerance is 1e-4 of it)."""
    assert (stream["symbol"], stream["pulse"], stream["delay"]) == ("T", pulse, delay)
    assert len({p["length"] for p in stream["points"]}) == 3
    for p in stream["points"]:
        for e in p["outputs"]:
            assert e["ok"] and e["max_abs"] <= SCALE_TOLERANCE * (e["tolerance"] / 1e-4), (p["label"], e)
    assert stream["chunk_ms"]["chunks"] > 0 and stream["chunk_ms"]["mean"] > 0


def signal(shape: tuple[int, ...], axis: int, length: int, seed: int) -> np.ndarray:
    sized = list(shape)
    sized[axis] = length
    return np.random.default_rng(seed).standard_normal(sized).astype(np.float32)


@pytest.mark.parametrize("case", ZOO, ids=[c.name for c in ZOO])
def test_zoo_round_trip(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if case.name.startswith("torchaudio"):
        pytest.importorskip("torchaudio")
    model = model_of(case.factory)
    spec = f"tests.streaming_models:seeded.{case.name}"
    path = str(tmp_path / f"{case.name}.nnef.tgz")
    example = "x:" + "x".join(map(str, case.shape))
    exported = cli(capsys, "export", spec, "--input", example, "--dynamic", f"x:{case.axis}=T", "-o", path,
                   "--stream", f"T={case.pulse}")  # fmt: skip
    assert_points(exported["stream"], case.pulse, case.delay)
    shown = cli(capsys, "inspect", path, "--no-shapes")["streaming"]
    assert (shown["symbol"], shown["pulse"], shown["delay"]) == ("T", case.pulse, case.delay)
    assert shown["inputs"] == {"x": case.axis}
    (out_name, (out_axis, out_delay)), *_ = shown["outputs"].items()
    assert out_delay == case.delay
    assert main(["inspect", path, "--no-shapes"]) == 0  # the table a user reads
    text = capsys.readouterr().out
    assert f"over T: x axis {case.axis} → {out_name} axis {out_axis} (delay {case.delay})" in text
    checked = cli(capsys, "check", path, "--stream", f"T={case.second}", "--model", spec)
    assert_points(checked["stream"], case.second, case.delay)

    length = case.shape[case.axis] + case.second + 5
    x = signal(case.shape, case.axis, length, 0)
    np.savez(tmp_path / "in.npz", x=x)
    out = str(tmp_path / "out.npz")
    ran = cli(capsys, "run", path, "--stream", f"T={case.second}", "--inputs", str(tmp_path / "in.npz"),
              "--out", out)  # fmt: skip
    assert (ran["pulse"], ran["delay"], ran["steps"]) == (case.second, case.delay, length)
    assert ran["real_time_factor"] > 0 and ran["chunks"] >= math.ceil(length / case.second)
    with np.load(out) as data:
        assert_whole_stream(model, x, case, data[out_name], out_axis, ran["chunks"] * case.second)

    # the API at the export pulse, tract in this process (the CLI's run used the child process)
    with torchlower.load(path).stream({"T": case.pulse}, isolated=False) as stream:
        assert (stream.pulse, stream.delay) == (case.pulse, case.delay)
        for seed, n in enumerate((case.shape[case.axis] + 7, case.shape[case.axis] // 2 + 3), start=1):
            x = signal(case.shape, case.axis, n, seed)
            result = stream.run({"x": x})
            got = result.outputs[out_name]
            assert_whole_stream(model, x, case, got, out_axis, result.chunks * case.pulse)


def test_python_m_torchlower_streams(tmp_path: Path) -> None:
    """One subprocess: ``python -m torchlower run --stream`` on an archive exported in process."""
    case = ZOO[0]
    model = model_of(case.factory)
    path = tmp_path / "tcn.nnef.tgz"
    torchlower.export(model, (torch.randn(case.shape),), path, dynamic_axes={"x": {case.axis: "T"}},
                      stream={"T": case.pulse})  # fmt: skip
    x = signal(case.shape, case.axis, 100, 0)
    np.savez(tmp_path / "in.npz", x=x)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run(
        [sys.executable, "-m", "torchlower", "run", str(path), "--stream", "T=24", "--inputs",
         str(tmp_path / "in.npz"), "--out", str(tmp_path / "out.npz"), "--json", "--rate", "100"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr + proc.stdout
    ran = json.loads(proc.stdout)
    assert (ran["pulse"], ran["delay"], ran["chunks"]) == (24, 0, 5) and ran["real_time_factor"] > 0
    with np.load(tmp_path / "out.npz") as data:
        assert_whole_stream(model, x, case, data["output"], 2, 5 * 24)

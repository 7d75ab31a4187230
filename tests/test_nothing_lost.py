"""Nothing lost: a killed writer, racing writers and failed exports never cost the user data.

Writers run as real subprocesses (``python -c WRITER``) and are killed with SIGKILL while their
temporary file is being written. A killed writer leaves its dot-prefixed temporary behind (no
process is left to remove it); the target name always holds a complete artifact or nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchlower
from torchlower.errors import CheckError, InvalidArgumentError, UnsupportedOpsError

ROOT = Path(__file__).resolve().parents[1]
WRITER = """
import sys, torch, torchlower
seed, width = int(sys.argv[2]), int(sys.argv[3])
torch.manual_seed(seed)
model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.Linear(width, 4)).eval()
torchlower.export(model, torch.ones(1, width), sys.argv[1], check=False)
"""


def model_for(seed: int, width: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(width, width), nn.Linear(width, 4)).eval()


def writer(target: Path, seed: int, width: int) -> subprocess.Popen[bytes]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target), str(seed), str(width)], cwd=ROOT, env=env
    )


def temporaries(folder: Path, target: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name.startswith(f".{target.name}.")]


def written_bytes(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return path.stat().st_size


def kill_mid_write(target: Path, min_bytes: int = 1 << 20, timeout: float = 60.0) -> None:
    """Start a large export and SIGKILL it once its temporary holds ``min_bytes``."""
    proc = writer(target, seed=7, width=3000)  # ~36 MB of weights
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            tmps = temporaries(target.parent, target)
            try:
                if tmps and written_bytes(tmps[0]) >= min_bytes:
                    break
            except FileNotFoundError:
                pass
            if proc.poll() is not None:
                pytest.fail("the writer finished before it could be killed mid-write")
            time.sleep(0.002)
        else:
            pytest.fail("the writer never started writing")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def small_export(target: Path) -> bytes | None:
    torchlower.export(model_for(1, 8), torch.ones(1, 8), target, check=False)
    return target.read_bytes() if target.is_file() else None


@pytest.mark.parametrize("suffix", [".nnef.tgz", ".nnef"])
def test_sigkill_mid_write_keeps_previous_artifact(tmp_path, suffix):
    target = tmp_path / f"m{suffix}"
    before = small_export(target)
    graph_before = torchlower.load(target).graph
    kill_mid_write(target)
    if before is not None:
        assert target.read_bytes() == before, "the previous artifact changed"
    art = torchlower.load(target)
    assert art.graph.op_histogram() == graph_before.op_histogram() and art.weights["0.weight"].shape == (8, 8)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != target.name]
    assert leftovers and all(n.startswith(f".{target.name}.") for n in leftovers), leftovers


def test_sigkill_mid_write_without_previous_leaves_no_target(tmp_path):
    target = tmp_path / "m.nnef.tgz"
    kill_mid_write(target)
    assert not target.exists()
    assert all(p.name.startswith(".m.nnef.tgz.") and p.name.endswith(".tmp") for p in tmp_path.iterdir())


def test_concurrent_exports_yield_one_valid_artifact(tmp_path):
    target, width = tmp_path / "m.nnef.tgz", 512
    procs = [writer(target, seed, width) for seed in (1, 2)]
    codes = [p.wait(timeout=120) for p in procs]
    assert codes == [0, 0]
    assert sorted(p.name for p in tmp_path.iterdir()) == [target.name], "temporaries left behind"
    x = torch.ones(1, width)
    got = torchlower.check(target, inputs=[x.numpy()]).outputs[0]  # loads it, runs it in tract
    matches = [
        bool(np.allclose(got, model_for(seed, width)(x).detach().numpy(), atol=1e-4)) for seed in (1, 2)
    ]
    assert matches.count(True) == 1, matches


class WithState(nn.Module):
    """Parameters, a frozen one and a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.fc.bias.requires_grad_(False)
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x):
        return torch.relu(self.fc(x))


class Unsupported(WithState):
    """Fails to export after running: a training-mode BatchNorm would update its statistics."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(4)

    def forward(self, x):
        return torch.special.bessel_j0(self.bn(self.fc(x)))


def snapshot(model: nn.Module, x: torch.Tensor) -> dict[str, object]:
    tensors = dict(model.state_dict(keep_vars=True))
    return {
        "bytes": {k: v.detach().clone() for k, v in tensors.items()},
        "ids": {k: id(v) for k, v in tensors.items()},
        "versions": {k: v._version for k, v in tensors.items()},
        "grad": {k: p.requires_grad for k, p in model.named_parameters()},
        "training": [m.training for m in model.modules()],
        "x": (x.detach().clone(), x._version, x.requires_grad, x.stride(), x.dtype),
    }


def assert_same(model: nn.Module, x: torch.Tensor, before: dict[str, object]) -> None:
    after = snapshot(model, x)
    for key in ("ids", "versions", "grad", "training"):
        assert after[key] == before[key], key
    for k, v in before["bytes"].items():  # type: ignore[union-attr]
        assert torch.equal(after["bytes"][k], v), k  # type: ignore[index]
    bx, ax = before["x"], after["x"]
    assert torch.equal(ax[0], bx[0]) and ax[1:] == bx[1:]  # type: ignore[index]


def test_model_and_inputs_bit_identical_after_any_export(tmp_path):
    model, x = WithState().train(), torch.randn(3, 4)
    before = snapshot(model, x)
    torchlower.export(model, x, tmp_path / "ok.nnef.tgz")  # succeeds, checked in tract
    assert_same(model, x, before)
    with pytest.raises(InvalidArgumentError):
        torchlower.export(model, x, tmp_path / "bad.onnx")
    with pytest.raises(InvalidArgumentError):
        torchlower.export(model, x, tmp_path / "missing" / "m.nnef.tgz")
    assert_same(model, x, before)
    bad, y = Unsupported().train(), torch.randn(3, 4, requires_grad=True)
    before_bad = snapshot(bad, y)
    with pytest.raises(UnsupportedOpsError):
        torchlower.export(bad, y, tmp_path / "u.nnef.tgz")
    assert_same(bad, y, before_bad)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok.nnef.tgz"]


def test_export_refuses_to_replace_a_foreign_directory(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "thesis.tex").write_text("years of work")
    for target in (home, tmp_path / "home.nnef"):
        if target != home:
            target.mkdir()
            (target / "graph.nnef").write_text("x")
            (target / "notes.txt").write_text("mine")
        with pytest.raises(InvalidArgumentError, match="refusing to replace"):
            torchlower.export(model_for(1, 8), torch.ones(1, 8), target, check=False)
    assert (home / "thesis.tex").read_text() == "years of work"
    assert (tmp_path / "home.nnef" / "notes.txt").read_text() == "mine"


class ScaledByMax(nn.Module):
    """``x / float(x.abs().max())``: a jit trace freezes the example's max, so the check fails."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / float(x.abs().max())


@pytest.mark.parametrize("suffix", [".nnef.tgz", ".nnef"])
def test_failed_check_leaves_no_file_and_keeps_the_previous_one(tmp_path, suffix):
    """A check failure (CheckError) leaves nothing where the archive would go: no file, no
    staging name; a previous artifact there stays byte-identical."""
    target, x = tmp_path / f"m{suffix}", torch.randn(2, 5)
    with pytest.raises(CheckError) as info:
        torchlower.export(ScaledByMax(), x, target, frontend="jit", allow_value_dependent_trace=True)
    assert str(target) in str(info.value) and "checking-" not in str(info.value)
    assert list(tmp_path.iterdir()) == []
    torchlower.export(model_for(1, 5), torch.ones(1, 5), target)
    before = {p.relative_to(target).as_posix(): p.read_bytes() for p in target.rglob("*") if p.is_file()}
    before = before or {"": target.read_bytes()}
    with pytest.raises(CheckError):
        torchlower.export(ScaledByMax(), x, target, frontend="jit", allow_value_dependent_trace=True)
    after = {p.relative_to(target).as_posix(): p.read_bytes() for p in target.rglob("*") if p.is_file()}
    assert (after or {"": target.read_bytes()}) == before
    assert [p.name for p in tmp_path.iterdir()] == [target.name]


def test_a_graph_tract_cannot_load_is_named_by_the_users_path(tmp_path):
    """The check runs at a staged name beside the target: tract's refusal names the target."""
    from torchlower.core.staging import staged
    from torchlower.nnef import tract

    target = tmp_path / "model.nnef.tgz"
    with pytest.raises(CheckError) as caught, staged(target) as staging:
        staging.write_bytes(b"not an archive")
        tract.run_in_tract(staging, [np.zeros(1, np.float32)])
    message = str(caught.value)
    assert str(target) in message and "(nothing written)" in message and staging.name not in message
    assert not target.exists() and not staging.exists()

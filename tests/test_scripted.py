"""Scripted and loaded TorchScript models (issue 30, item 2).

A ``torch.jit.script``-ed or ``torch.jit.load``-ed module reaches the jit front end as its
scripted graph: branches on attributes and sizes are taken, loops with known trip counts are
unrolled, Python-level ops (``len``, ``is None``, ``isinstance``, list appends) are evaluated.
silero-vad's shipped ``silero_vad.jit`` (pretrained) is the real model: its 16 kHz network
exports and matches PyTorch in tract on several chunks and states.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchlower
from torchlower.errors import InvalidArgumentError, LoweringError, TorchlowerError


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
        y = self.linear(x)
        if scale is not None:
            y = y * scale
        return y


class Scripted(nn.Module):
    """Branches on an attribute, a size and an Optional; a loop; a list built in Python."""

    def __init__(self, sample_rate: int) -> None:
        super().__init__()
        self.sample_rate = sample_rate
        self.blocks = nn.ModuleList([Block(), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.sample_rate != 16000 and self.sample_rate != 8000:
            raise ValueError("unsupported sample rate")
        if x.dim() == 1:
            x = x.unsqueeze(0)
        parts: list[torch.Tensor] = []
        for i, block in enumerate(self.blocks):
            x = block(x, None) if i == 0 else block(x, torch.ones(1) * 0.5)
            parts.append(x)
        for _ in range(3):
            x = torch.tanh(x) + parts[len(parts) - 1]
        if self.sample_rate == 16000:
            return x.relu()
        return x.sigmoid()


@pytest.mark.parametrize("rate", [16000, 8000])
def test_scripted_control_flow_is_specialized(rate: int, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.jit.script(Scripted(rate).eval())
    report = torchlower.export(model, torch.randn(3, 6), tmp_path / "m.nnef.tgz")
    assert report.frontend == "jit" and report.max_abs_error < 1e-5
    histogram = report.op_histogram
    assert histogram["tanh"] == 3, "the loop is unrolled three times"
    # 16000: relu (NaN-keeping: x < 0 ? 0 : x, rules/nan.py); 8000: sigmoid (its accurate form)
    assert ("lt" in histogram and "exp" not in histogram) == (rate == 16000), histogram


def test_a_loaded_script_module_exports(tmp_path: Path) -> None:
    torch.manual_seed(0)
    torch.jit.save(torch.jit.script(Scripted(16000).eval()), tmp_path / "model.jit")
    loaded = torch.jit.load(tmp_path / "model.jit")
    report = torchlower.export(loaded, torch.randn(3, 6), tmp_path / "m.nnef.tgz")
    assert report.frontend == "jit" and report.max_abs_error < 1e-5


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_other_front_ends_refuse_a_script_module_by_name(frontend: str, tmp_path: Path) -> None:
    model = torch.jit.script(Scripted(16000).eval())
    with pytest.raises(InvalidArgumentError, match=r"frontend='\w+' cannot read a TorchScript module.*'jit'"):
        torchlower.export(model, torch.randn(3, 6), tmp_path / "m.nnef.tgz", frontend=frontend)
    assert not (tmp_path / "m.nnef.tgz").exists()


class ValueBranch(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > 0):
            return x * 2
        return x


def test_a_branch_on_tensor_values_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(LoweringError, match=r"prim::If.*depends on tensor values") as caught:
        torchlower.export(torch.jit.script(ValueBranch()), torch.randn(2, 3), tmp_path / "m.nnef.tgz")
    assert "test_scripted.py" in str(caught.value), "the message names the model's line"
    assert not (tmp_path / "m.nnef.tgz").exists()


def test_a_raise_on_the_taken_path_is_a_typed_error(tmp_path: Path) -> None:
    model = torch.jit.script(Scripted(44100).eval())  # scripting is fine; running raises
    with pytest.raises(TorchlowerError):
        torchlower.export(model, torch.randn(3, 6), tmp_path / "m.nnef.tgz")
    assert not (tmp_path / "m.nnef.tgz").exists()


def _silero() -> torch.jit.ScriptModule:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or spec.origin is None:
        pytest.skip("silero-vad is not installed (requirements-dev.txt pins it)")
    return torch.jit.load(str(Path(spec.origin).parent / "data" / "silero_vad.jit")).eval()


def test_silero_vad_shipped_16k_network(tmp_path: Path) -> None:
    """The pretrained 16 kHz network as silero-vad ships it: 64 samples of context + 512 of audio
    and the LSTM state in, speech probability and the next state out."""
    network = _silero()._model
    chunk, state = torch.randn(1, 576) * 0.1, torch.zeros(2, 1, 128)
    report = torchlower.export(
        network, (chunk, state), tmp_path / "vad.nnef.tgz", input_names=["x", "state"],
        output_names=["prob", "next_state"],
    )  # fmt: skip
    assert report.frontend == "jit" and report.max_abs_error < 1e-4
    with torchlower.load(report.path) as art:  # a few chunks fed back through the state
        torch.manual_seed(1)
        for _ in range(4):
            chunk = torch.randn(1, 576) * 0.3
            want_prob, want_state = network(chunk, state)
            got = art.run({"x": chunk.numpy(), "state": state.numpy()})
            assert np.abs(got["prob"] - want_prob.detach().numpy()).max() < 1e-4
            assert np.abs(got["next_state"] - want_state.detach().numpy()).max() < 1e-4
            state = want_state.detach()


def test_cli_exports_a_saved_torchscript_file_and_its_submodule(tmp_path: Path) -> None:
    from tests.test_cli import cli, cli_json

    torch.manual_seed(0)
    torch.jit.save(torch.jit.script(Scripted(8000).eval()), tmp_path / "m.jit")
    data = cli_json("export", str(tmp_path / "m.jit"), "-o", str(tmp_path / "a.nnef.tgz"), "--input", "x:3x6")
    assert data["ok"] and data["frontend"] == "jit" and data["max_abs_error"] < 1e-5
    data = cli_json(
        "export", f"{tmp_path / 'm.jit'}:blocks.0", "-o", str(tmp_path / "b.nnef.tgz"), "--input", "x:3x6"
    )
    assert data["ok"] and data["max_abs_error"] < 1e-5
    proc = cli("export", f"{tmp_path / 'm.jit'}:nope", "-o", str(tmp_path / "c.nnef.tgz"), "--input", "x:3x6")
    assert proc.returncode != 0 and "no 'nope'" in proc.stderr and "blocks" in proc.stderr


@torch.jit.script_if_tracing
def _overlap_add(frames: torch.Tensor, hop: int) -> torch.Tensor:
    """asteroid-style overlap-add helper: scripted when traced, a loop of in-place slice adds."""
    count, size = frames.shape[-2], frames.shape[-1]
    out = torch.zeros(frames.shape[0], (count - 1) * hop + size)
    for i in range(count):
        out[:, i * hop : i * hop + size] += frames[:, i]
    return out


class OverlapAdd(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _overlap_add(x.relu(), 2)


def test_script_if_tracing_helpers_are_inlined_under_jit(tmp_path: Path) -> None:
    report = torchlower.export(OverlapAdd(), torch.randn(2, 5, 4), tmp_path / "m.nnef.tgz", frontend="jit")
    assert report.frontend == "jit" and report.max_abs_error < 1e-6


@torch.jit.script_if_tracing
def _glob_norm(x: torch.Tensor) -> torch.Tensor:
    """asteroid's ``_glob_norm``: the dims from the rank, read back from a tensor (``tolist``)."""
    dims: list[int] = torch.arange(1, len(x.shape)).tolist()
    if x.ndim == 3:
        mean = x.mean(dim=dims, keepdim=True)
        return (x - mean) / (torch.var(x, dim=dims, keepdim=True, unbiased=False) + 1e-8).sqrt()
    return x


class GlobNorm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _glob_norm(x * 2)


def test_script_if_tracing_helpers_follow_dynamic_axes(tmp_path: Path) -> None:
    """The helper is traced through as Python (its nodes have shapes; a scripted graph's control
    flow could not follow a dynamic axis), checked at the export's other sizes."""
    report = torchlower.export(
        GlobNorm().eval(), torch.randn(2, 3, 16), tmp_path / "m.nnef.tgz", frontend="jit",
        dynamic_axes={"x": {0: "B", 2: "T"}},
    )  # fmt: skip
    assert report.inputs[0].shape == ("B", 3, "T") and report.outputs[0].shape == ("B", 3, "T")
    sized = [p for p in report.points if "T=" in p.label]
    assert len(sized) >= 2 and all(p.ok for p in sized) and report.max_abs_error < 1e-5, report.points


class ShapeLists(nn.Module):
    """What scripted helpers do with sizes: ``tolist()`` of an ``arange`` over the rank,
    ``torch.tensor(x.shape)``, ``x.shape[:-2] + [-1]`` (list slice and concatenation)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dims: list[int] = torch.arange(1, len(x.shape)).tolist()
        size = torch.tensor(x.shape)
        y = x - x.mean(dim=dims, keepdim=True) if len(size) == 3 else x
        return y.reshape(x.shape[:-2] + [-1])  # noqa: RUF005  (a list concatenation, as scripted)


def test_scripted_size_lists_fold(tmp_path: Path) -> None:
    report = torchlower.export(
        torch.jit.script(ShapeLists().eval()), torch.randn(2, 3, 16), tmp_path / "m.nnef.tgz", frontend="jit"
    )
    assert report.outputs[0].shape == (2, 48) and report.max_abs_error < 1e-5

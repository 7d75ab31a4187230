"""The reference exporter's dynamic-axes cases (issue 28, item 8), as our own small models.

torch_to_nnef's ``tests/test_dynamic_axes.py`` and ``test_dynamic_axes_multisize.py`` check one
symbolic axis per model: sizes taken from ``x.shape`` into factories, slices at ``S // 2`` or
past the end, ``repeat``/``unfold``/``repeat_interleave`` along the axis, a causal mask from a
past length, a data-dependent pick, a negative pad, reshapes from sizes, attention. Each is
exported here through every front end with the same example shapes (batch 1 where the reference
uses it) and checked in tract by the export itself: at the example, at random inputs like it and
at other sizes of every symbol, each compared with PyTorch at that size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchlower
from torchlower.core.dynamic import resize
from torchlower.errors import DynamicAxisError, ValueDependentTraceError
from torchlower.nnef.tract import run_in_tract

FRONTENDS = ("jit", "fx", "export")
Axes = dict[str, dict[int, str]]


class ShapeFactory(nn.Module):
    """A tensor made from the input's shape alone (``torch.ones(x.shape)``)."""

    def __init__(self, fill: float | None) -> None:
        super().__init__()
        self.fill = fill

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fill is None:
            return torch.ones(x.shape, dtype=torch.float32)
        return torch.full(x.shape, self.fill, dtype=torch.float32)


class Lambda(nn.Module):
    def __init__(self, fn: Callable[..., torch.Tensor]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


class ClippedStack(nn.Module):
    """A DeepSpeech-like speech model: clipped-ReLU linears per frame, a bidirectional ReLU RNN
    over time (directions summed), a per-frame log-softmax; ``x`` is (B, 1, T, F)."""

    def __init__(self, features: int = 64, hidden: int = 32, classes: int = 12) -> None:
        super().__init__()
        self.fcs = nn.ModuleList([nn.Linear(features, hidden), nn.Linear(hidden, hidden)])
        self.rnn = nn.RNN(hidden, hidden, nonlinearity="relu", bidirectional=True)
        self.fc = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, classes)
        self.hidden = hidden

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for fc in self.fcs:
            x = torch.clamp(fc(x).relu(), max=20.0)
        x = x.squeeze(1).transpose(0, 1)  # (T, B, H)
        x, _ = self.rnn(x)
        x = x[:, :, : self.hidden] + x[:, :, self.hidden :]
        x = self.out(torch.clamp(self.fc(x).relu(), max=20.0))
        return x.permute(1, 0, 2).log_softmax(dim=2)


class MaskFromPast(nn.Module):
    """A causal mask sized from the new length S and a past length P read off a cache tensor,
    the past taken back from an ``arange`` over the positions (a size through a tensor value)."""

    def forward(self, embeds: torch.Tensor, past: torch.Tensor) -> torch.Tensor:
        s, p = embeds.shape[1], past.shape[2]
        positions = torch.arange(p, p + s)
        return torch.full((s, positions[0] + s + 1), -100.0, dtype=torch.float32)


class LastNonPad(nn.Module):
    """Each row's last non-padding entry: lengths counted from the values, then gathered."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = x.ne(0).sum(dim=1).long() - 1
        return x[torch.arange(x.size(0)), last]


class StaticHalves(nn.Module):
    """``x.shape[-1] // 2`` on a static axis sizes a split while axis 1 is dynamic."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = x.shape[-1]
        a, b = torch.split(x, [f // 2, f - f // 2], dim=-1)
        return a + b


class ReshapeFromSizes(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        return x.reshape(b, t * c)


class TransposeConvReshape(nn.Module):
    """The dynamic axis moved by a transpose, narrowed by a conv, then a reshape with ``-1``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 10, 3)
        self.linear = nn.Linear(80, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x.transpose(1, 2).unsqueeze(1))
        b, width = x.shape[0], x.shape[3]
        return self.linear(x.transpose(1, 3).reshape([b, width, -1]))


class TwoAttentionLayers(nn.Module):
    """Hand-written self-attention twice: heads by view + transpose, sizes read from ``x``."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads, self.hd = heads, d // heads
        self.layers = nn.ModuleList(nn.ModuleList(nn.Linear(d, d) for _ in range(4)) for _ in range(2))

    def split(self, t: torch.Tensor, b: int, s: int) -> torch.Tensor:
        return t.view(b, s, self.heads, self.hd).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for q_proj, k_proj, v_proj, o_proj in self.layers:
            b, s, _ = x.shape
            q, k, v = (self.split(p(x), b, s) for p in (q_proj, k_proj, v_proj))
            att = ((q @ k.transpose(-1, -2)) / self.hd**0.5).softmax(-1) @ v
            x = x + o_proj(att.transpose(1, 2).reshape(b, s, self.heads * self.hd))
        return x


class FlattenUnflatten(nn.Module):
    """A static batch reused in a reshape after a flatten with the dynamic axis."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, f = x.shape
        return x.reshape(b * s, f).reshape(s, b, f)


class BatchFirstAttention(nn.Module):
    """``nn.MultiheadAttention`` on (B, S, E) inputs transposed to (S, B, E), optionally with a
    causal boolean mask of shape (B * heads, S, S)."""

    def __init__(self, heads: int, causal: bool) -> None:
        super().__init__()
        self.heads, self.causal = heads, causal
        self.attention = nn.MultiheadAttention(64, heads)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.transpose(0, 1) for t in (query, key, value))
        mask = None
        if self.causal:
            ones = torch.ones((query.shape[0] * self.heads, q.shape[0], k.shape[0]), dtype=torch.bool)
            mask = torch.triu(ones, diagonal=1)
        out, _ = self.attention(q, k, v, attn_mask=mask, need_weights=False)
        return out.transpose(0, 1)


def _last_nonpad_example() -> torch.Tensor:
    x = torch.zeros(3, 10)
    for row, pad in enumerate((1, 3, 2)):
        x[row, : 10 - pad] = torch.arange(1, 11 - pad)
    return x


@dataclass(frozen=True)
class Case:
    model: Callable[[], nn.Module]
    example: Callable[[], tuple[torch.Tensor, ...]]
    axes: Axes
    refused: bool = False  # PyTorch itself runs the model at the example size only


def _x(axis: int, symbol: str = "S") -> Axes:
    return {"x": {axis: symbol}}


def _qkv(*shape: int) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: tuple(torch.randn(*shape) for _ in range(3))


CASES: dict[str, Case] = {
    # tests/test_dynamic_axes.py
    "speech_rnn_time": Case(ClippedStack, lambda: (torch.rand(1, 1, 100, 64),), _x(2)),
    "ones_of_shape_s2": Case(lambda: ShapeFactory(None), lambda: (torch.rand(1, 2, 3),), _x(2)),
    "ones_of_shape_s10": Case(lambda: ShapeFactory(None), lambda: (torch.rand(1, 10, 3),), _x(2)),
    "full_of_shape": Case(lambda: ShapeFactory(5.0), lambda: (torch.rand(1, 4, 3),), _x(2)),
    "repeat_interleave_int": Case(
        lambda: Lambda(lambda x: torch.repeat_interleave(x, repeats=3, dim=2)),
        lambda: (torch.tensor([[[1, 2]], [[3, 4]], [[5, 6]]]),),
        _x(2),
    ),
    "slice_to_half": Case(
        lambda: Lambda(lambda x: x[..., : x.shape[-1] // 2]),
        lambda: (torch.arange(1, 9, dtype=torch.float32).reshape(1, 2, 1, 4),),
        _x(3),
    ),
    "slice_from_half": Case(
        lambda: Lambda(lambda x: x[..., x.shape[-1] // 2 :]),
        lambda: (torch.arange(1, 9, dtype=torch.float32).reshape(1, 2, 1, 4),),
        _x(3),
    ),
    "slice_last_three": Case(lambda: Lambda(lambda x: x[:, -3:]), lambda: (torch.rand(2, 1),), _x(1)),
    "slice_past_the_end": Case(lambda: Lambda(lambda x: x[:, :1000]), lambda: (torch.rand(2, 1),), _x(1)),
    "repeat_by_own_size": Case(
        lambda: Lambda(lambda x: x.repeat(1, x.shape[-1])),
        lambda: (torch.rand(2, 1),),
        _x(1),
    ),
    "expand_to_twice_size": Case(
        lambda: Lambda(lambda x: x.expand([2, x.shape[1] * 2])),
        lambda: (torch.rand(2, 1),),
        _x(1),
        refused=True,
    ),
    "mask_from_past_length": Case(
        MaskFromPast,
        lambda: (torch.rand(2, 10), torch.rand(1, 4, 5, 3)),
        {"embeds": {1: "S"}, "past": {2: "P"}},
    ),
    "pick_last_non_pad": Case(LastNonPad, lambda: (_last_nonpad_example(),), _x(1)),
    "negative_pad_crops": Case(
        lambda: nn.ConstantPad2d((0, 0, -2, 2), 0.0),
        lambda: (torch.rand(1, 1, 100, 64),),
        {"input": {2: "S"}},
    ),
    "unfold_last_axis": Case(
        lambda: Lambda(lambda x: x.unfold(1, 3, 1)), lambda: (torch.arange(24.0).reshape(2, 12),), _x(1)
    ),
    "unfold_middle_axis": Case(
        lambda: Lambda(lambda x: x.unfold(1, 3, 1)),
        lambda: (torch.arange(96.0).reshape(2, 12, 4),),
        _x(1),
    ),
    "split_static_axis": Case(StaticHalves, lambda: (torch.arange(192.0).reshape(2, 12, 8),), _x(1)),
    # tests/test_dynamic_axes_multisize.py
    "split_static_axis_batch1": Case(StaticHalves, lambda: (torch.rand(1, 12, 8),), _x(1)),
    "reshape_from_sizes_batch1": Case(ReshapeFromSizes, lambda: (torch.rand(1, 4, 3),), _x(0, "B")),
    "transpose_conv_reshape": Case(TransposeConvReshape, lambda: (torch.rand(1, 1000, 10),), _x(1)),
    "two_attention_layers": Case(TwoAttentionLayers, lambda: (torch.rand(1, 8, 16),), _x(1)),
    "flatten_unflatten_static_batch": Case(FlattenUnflatten, lambda: (torch.rand(4, 16, 8),), _x(1)),
    **{
        f"multihead_attention_h{h}{'_causal' if causal else ''}": Case(
            lambda h=h, causal=causal: BatchFirstAttention(h, causal),
            _qkv(4, 16, 64),
            {"query": {1: "S"}, "key": {1: "S"}, "value": {1: "S"}},
        )
        for h in (1, 4)
        for causal in (False, True)
    },
}


# export: where torch.export asks for a guard PyTorch does not need, the program is exported
# size-oblivious, so the check runs on both sides of that guard (the archive is right at both)
GUARD_SIDES = {
    "slice_to_half": (4, 5),  # S = 2*_S
    "slice_from_half": (4, 5),
    "slice_last_three": (2, 3),  # S = 2, the capture size (the slice clamps below 3)
    "slice_past_the_end": (999, 1000),  # S <= 999
    "unfold_middle_axis": (3, 4),  # S >= 4 (then the model's own 3 <= S)
    "unfold_last_axis": (3, 4),  # S - 2 != 1 within the model's 3 <= S
    "transpose_conv_reshape": (3, 4),
}


def _export(name: str, frontend: str, tmp_path: Path) -> tuple[nn.Module, torchlower.ExportReport]:
    case = CASES[name]
    torch.manual_seed(0)
    model = case.model().eval()
    path = tmp_path / "m.nnef.tgz"
    return model, torchlower.export(model, case.example(), path, frontend=frontend, dynamic_axes=case.axes)


def _at(case: Case, names: list[str], size: int) -> tuple[torch.Tensor, ...]:
    """The example with every symbol at ``size`` (values cycled, so ids and masks stay valid)."""
    out = []
    for name, t in zip(names, case.example(), strict=True):
        for axis in case.axes.get(name, {}):
            t = resize(t, axis, size)
        out.append(t)
    return tuple(out)


def _run_at_more_sizes(case: Case, model: nn.Module, report: torchlower.ExportReport) -> list[int]:
    """The archive run at sizes the export's check did not use (2, 3, and one past the example),
    compared with PyTorch there; the sizes PyTorch accepts are returned."""
    names = [i.name for i in report.inputs]
    example = dict(zip(names, case.example(), strict=True))
    base = max(example[n].shape[a] for n, axes in case.axes.items() for a in axes)
    checked = []
    for size in (2, 3, base + 9):
        inputs = _at(case, names, size)
        try:
            with torch.no_grad():
                want = model(*inputs)
        except (RuntimeError, ValueError, IndexError):
            continue  # PyTorch refuses this size (a kernel longer than the input)
        got = run_in_tract(report.path, [t.numpy() for t in inputs])
        assert got[0].shape == tuple(want.shape), (size, got[0].shape, want.shape)
        assert np.allclose(got[0], want.numpy(), rtol=1e-4, atol=1e-4), (
            size,
            np.abs(got[0] - want.numpy()).max(),
        )
        checked.append(size)
    return checked


@pytest.mark.parametrize("frontend", FRONTENDS)
@pytest.mark.parametrize("name", [n for n, c in CASES.items() if not c.refused])
def test_reference_dynamic_case(name: str, frontend: str, tmp_path: Path) -> None:
    case = CASES[name]
    model, report = _export(name, frontend, tmp_path)
    for info in report.inputs:  # the archive's inputs really are symbolic
        for axis, symbol in case.axes.get(info.name, {}).items():
            assert info.shape[axis] == symbol, (info.name, info.shape)
    assert all(p.ok or p.skipped for p in report.points), [(p.label, p.errors) for p in report.points]
    sizes = [p for p in report.points if "=" in p.label and not p.skipped]
    assert sizes and all(p.ok for p in sizes), [p.label for p in report.points]  # other sizes, checked
    assert _run_at_more_sizes(case, model, report)
    if frontend == "export" and name in GUARD_SIDES:
        (axis,) = case.axes["x"]  # one input, one symbol
        base = case.example()[0].shape[axis]
        checked = {base, *(int(p.label.split("=")[1]) for p in sizes if p.ok)}
        assert set(GUARD_SIDES[name]) <= checked, (sorted(checked), report.notes)
        assert any("size-oblivious" in n and "both sides of the guard" in n for n in report.notes)


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_a_model_that_runs_at_one_size_only_is_refused_by_name(frontend: str, tmp_path: Path) -> None:
    """``x.expand(2, 2 * S)`` runs only at S = 1 (torch refuses any other size): no front end
    exports S as dynamic; the error names the input, the axis and the fix."""
    with pytest.raises(DynamicAxisError, match=r"input 'x' axis 1 \(S\) cannot be dynamic") as err:
        _export("expand_to_twice_size", frontend, tmp_path)
    assert "static" in str(err.value) and "expand" in str(err.value)
    assert not (tmp_path / "m.nnef.tgz").exists()


class CountSized(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = (x > 0.5).sum() + x.shape[1]
        return torch.zeros(x.shape[0], n.item())


def test_export_reads_back_sizes_only(tmp_path: Path) -> None:
    """torch.export's ``item`` of ``arange(P, P + S)[0] + S`` is the size ``P + S`` (the mask
    case above); an ``item`` of data (a count of values) is still refused by its source line."""
    with pytest.raises(
        ValueDependentTraceError, match=r"test_dynamic_reference_cases.py:\d+: `return torch.zeros"
    ):
        torchlower.export(
            CountSized(), torch.rand(2, 5), tmp_path / "m.nnef.tgz", frontend="export", dynamic_axes=_x(1)
        )


class PositionsAsTensors(nn.Module):
    """Elements of an arange over sizes used as tensors again (copied, cast, shifted)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first = torch.arange(3, 3 + x.shape[1])[0].clone()
        last = torch.arange(x.shape[1])[-1].detach()
        return x * first.float() + last.to(torch.float32) + (last + 1).float()


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_sizes_read_from_an_arange_stay_tensors_where_used_as_tensors(frontend: str, tmp_path: Path) -> None:
    report = torchlower.export(
        PositionsAsTensors(), torch.rand(2, 5), tmp_path / "m.nnef.tgz", frontend=frontend, dynamic_axes=_x(1)
    )
    assert [p.label for p in report.points if "=" in p.label and p.ok] == ["S=2", "S=9"]
    x = torch.rand(2, 13)
    got = run_in_tract(report.path, [x.numpy()])[0]
    assert np.allclose(got, PositionsAsTensors()(x).numpy(), atol=1e-5)  # last = 12 there, not 4

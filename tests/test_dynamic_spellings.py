"""Dynamic axes as users write them (issue 13): bounded Dims, ``*args``, sizes the model refuses,
slices past a symbolic end, non-affine sizes, and one clean paragraph when an axis cannot be dynamic.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchlower
import torchlower.artifact.io
from torchlower.errors import InvalidArgumentError, LoweringError

Dim = torch.export.Dim
FRONTENDS = ("jit", "fx", "export")


class Lin(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).relu()


def _graph(report: torchlower.ExportReport) -> str:
    path = report.path
    return (path / "graph.nnef").read_text() if path.is_dir() else ""


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_dim_bounds_are_kept(frontend: str, tmp_path: Path) -> None:
    report = torchlower.export(
        Lin().eval(), torch.randn(2, 5, 8), tmp_path / "m.nnef", frontend=frontend,
        dynamic_shapes=({1: Dim("S", min=4, max=6)},),
    )  # fmt: skip
    text = _graph(report)
    assert "extension tract_assert S >= 4;" in text and "extension tract_assert S <= 6;" in text
    sizes = {p.label for p in report.points if p.label.startswith("S=")}
    assert sizes == {"S=4", "S=6"} and all(
        p.ok for p in report.points if p.skipped is None
    )  # inside the bounds


def test_dynamic_axes_bounds_spelling(tmp_path: Path) -> None:
    report = torchlower.export(
        Lin().eval(), torch.randn(2, 5, 8), tmp_path / "m.nnef", dynamic_axes={"x": {1: ("S", 2, 128)}}
    )
    assert "extension tract_assert S <= 128;" in _graph(report)
    with pytest.raises(InvalidArgumentError, match="bounds"):
        torchlower.export(
            Lin(), torch.randn(2, 5, 8), tmp_path / "n.nnef", dynamic_axes={"x": {1: ("S", 0, 9)}}
        )
    with pytest.raises(InvalidArgumentError, match="outside its bounds"):
        torchlower.export(
            Lin(), torch.randn(2, 5, 8), tmp_path / "n.nnef", dynamic_axes={"x": {1: ("S", 6, 9)}}
        )


class Var(nn.Module):
    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return xs[0] * 2 + xs[1]


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_varargs_forward_with_dynamic_axes(frontend: str, tmp_path: Path) -> None:
    report = torchlower.export(
        Var(), (torch.randn(2, 5), torch.randn(2, 5)), tmp_path / "m.nnef.tgz", frontend=frontend,
        dynamic_axes={"xs_0": {1: "S"}, "xs_1": {1: "S"}},
    )  # fmt: skip
    assert [i.name for i in report.inputs] == ["xs_0", "xs_1"] and report.outputs[0].shape == (2, "S")
    assert {"S=2", "S=9"} <= {p.label for p in report.points}


class One(nn.Module):
    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return xs[0] * 2


class HeadVar(nn.Module):
    def forward(self, x: torch.Tensor, *past: torch.Tensor) -> torch.Tensor:
        return x - past[0] * past[1]


def _nested_spellings() -> list[tuple[nn.Module, tuple[torch.Tensor, ...], object]]:
    S, B = Dim("S", max=64), Dim("B", max=16)
    two = (torch.randn(2, 5), torch.randn(2, 5))
    three = (torch.randn(2, 5), torch.randn(2, 5), torch.randn(2, 5))
    return [
        (Var(), two, {"xs": ({1: S}, {1: S})}),  # torch.export's dict by parameter
        (Var(), two, (({1: S}, {1: S}),)),  # its tuple by parameter, *xs nested
        (Var(), two, ({1: S}, {1: S})),  # torchlower's flat tuple, one entry per tensor
        (One(), (torch.randn(2, 5),), {"xs": ({1: S},)}),  # a single tensor through *xs
        (HeadVar(), three, {"x": {0: B, 1: S}, "past": ({0: B, 1: S}, (B, S))}),
        (HeadVar(), three, ({0: B, 1: S}, ({0: B, 1: S}, (B, S)))),
    ]


@pytest.mark.parametrize("case", range(6))
def test_varargs_nested_dynamic_shapes_as_torch_export_takes_them(case: int, tmp_path: Path) -> None:
    """``dynamic_shapes`` for ``forward(*args)`` in torch.export's own spellings, and the flat one."""
    model, example, shapes = _nested_spellings()[case]
    report = torchlower.export(
        model, example, tmp_path / "m.nnef.tgz", frontend="export", dynamic_shapes=shapes
    )
    assert report.outputs[0].shape[-1] == "S" and all(p.ok for p in report.points if p.skipped is None)
    assert sum("S=" in p.label for p in report.points) == 2  # the check ran at other sizes
    with torchlower.load(report.path) as art:
        xs = [torch.randn(3 if case >= 4 else 2, 11) for _ in example]
        got = art.run({i.name: x.numpy() for i, x in zip(report.inputs, xs, strict=True)})["output"]
    assert torch.allclose(torch.from_numpy(got), model(*xs), atol=1e-5)


def test_varargs_dynamic_shapes_wrong_count_is_named(tmp_path: Path) -> None:
    two = (torch.randn(2, 5), torch.randn(2, 5))
    with pytest.raises(InvalidArgumentError, match=r"dynamic_shapes\['xs'\] must be a tuple with one entry"):
        torchlower.export(Var(), two, tmp_path / "m.nnef.tgz", dynamic_shapes={"xs": ({1: Dim("S")},)})
    with pytest.raises(InvalidArgumentError, match="unknown inputs"):
        torchlower.export(Var(), two, tmp_path / "m.nnef.tgz", dynamic_shapes={"ys": ({1: Dim("S")},)})
    assert list(tmp_path.iterdir()) == []


class Conv(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


@pytest.mark.parametrize("frontend", ["jit", "fx"])
def test_check_sizes_pytorch_refuses_are_skipped_and_reported(frontend: str, tmp_path: Path) -> None:
    report = torchlower.export(
        Conv().eval(), torch.randn(1, 4, 5), tmp_path / "m.nnef.tgz", frontend=frontend,
        dynamic_axes={"x": {2: "S"}},
    )  # fmt: skip
    skipped = {p.label: p.skipped for p in report.points if p.skipped and p.label != "special values"}
    assert list(skipped) == ["S=2"] and "Kernel size can't be greater" in skipped["S=2"]
    assert any(p.label == "S=9" and p.ok for p in report.points)


def test_export_front_end_adopts_the_bound_the_model_needs(tmp_path: Path) -> None:
    """A kernel of 3 needs S >= 3 (PyTorch fails at 2): torch.export's bound is adopted, its
    remaining "is the output size 1?" question answered size-oblivious, and the archive is
    checked at S = 3, where that output size is 1 (issue 28: bounds adopted, not refused)."""
    report = torchlower.export(
        Conv().eval(), torch.randn(1, 4, 5), tmp_path / "m.nnef.tgz", frontend="export",
        dynamic_axes={"x": {2: "S"}},
    )  # fmt: skip
    assert report.frontend == "export" and any("3 <= S" in n for n in report.notes), report.notes
    assert "S=3" in {p.label for p in report.points if p.ok}
    assert "extension tract_assert S >= 3;" in torchlower.artifact.io.graph_text(report.path)


class SliceBig(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, :1000] * 2


class Tail(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[:, -3:] * 2


class Repeat(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat(1, x.shape[1])


@pytest.mark.parametrize("frontend", ["jit", "fx"])
@pytest.mark.parametrize(
    ("model", "shape"), [(SliceBig, (2, "S")), (Tail, (2, "min(3, S)")), (Repeat, (2, "S * S"))]
)
def test_sizes_beyond_affine_lower_and_verify(
    model: type[nn.Module], shape: tuple[int | str, ...], frontend: str, tmp_path: Path
) -> None:
    report = torchlower.export(
        model(), torch.randn(2, 5), tmp_path / "m.nnef", frontend=frontend, dynamic_axes={"x": {1: "S"}}
    )
    assert report.outputs[0].shape == shape
    assert {"S=2", "S=9"} <= {p.label for p in report.points} and all(
        p.ok for p in report.points if p.skipped is None
    )
    if model is SliceBig:
        assert "end = [min(1000, S)]" in _graph(report)
        assert torchlower.check(report.path, model=model(), symbol_sizes={"S": 1200}).ok  # torch clamps too


def test_repeat_by_a_size_under_export(tmp_path: Path) -> None:
    report = torchlower.export(
        Repeat(), torch.randn(2, 5), tmp_path / "m.nnef", frontend="export", dynamic_axes={"x": {1: "S"}}
    )
    assert report.outputs[0].shape == (2, "S * S") and all(p.ok for p in report.points if p.skipped is None)


def test_slice_past_a_bounded_end_under_export(tmp_path: Path) -> None:
    report = torchlower.export(
        SliceBig(), torch.randn(2, 5), tmp_path / "m.nnef", frontend="export",
        dynamic_axes={"x": {1: ("S", 1, 999)}},
    )  # fmt: skip
    assert all(p.ok for p in report.points if p.skipped is None)


class Pinned(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(2, 8) + 1


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_cannot_be_dynamic_is_one_paragraph_naming_the_line(frontend: str, tmp_path: Path, capfd) -> None:
    with pytest.raises(LoweringError) as info:
        torchlower.export(
            Pinned(), torch.randn(2, 8), tmp_path / "m.nnef", frontend=frontend, dynamic_axes={"x": {0: "B"}}
        )
    text = str(info.value)
    assert text.count("cannot be dynamic") == 1 and "\n" not in text and "input 'x' axis 0 (B)" in text
    assert "Constraints violated" not in text and "L['x']" not in text
    if frontend != "fx":
        assert "test_dynamic_spellings.py:" in text and "x.reshape(2, 8)" in text
    else:
        assert "reshape" in text
    assert "Traceback" not in capfd.readouterr().err  # nothing else printed

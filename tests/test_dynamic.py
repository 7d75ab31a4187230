"""Dynamic axes: one artifact, run in tract at several sizes per symbol (including 1), each
compared with PyTorch at that size."""

from __future__ import annotations

import itertools
import os
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchlower
from torchlower.core.dynamic import resize
from torchlower.errors import InvalidArgumentError, LoweringError
from torchlower.nnef.tract import run_in_tract

os.environ.setdefault("HF_HUB_OFFLINE", "1")

SIZES = {"B": (1, 3, 5), "S": (1, 4, 9)}
DYNAMIC_FRONTENDS = ("jit", "fx", "export")


def at_sizes(
    example: Sequence[torch.Tensor], axes: Mapping[int, Mapping[int, str]], sizes: Mapping[str, int]
) -> tuple[torch.Tensor, ...]:
    out = []
    for i, t in enumerate(example):
        for axis, symbol in axes.get(i, {}).items():
            t = resize(t, axis, sizes[symbol])
        out.append(t)
    return tuple(out)


def export_dynamic(
    model: nn.Module,
    example: Sequence[torch.Tensor],
    tmp_path: Path,
    frontend: str,
    dynamic_axes: Mapping[str, Mapping[int, str]],
    tolerance: float = 1e-4,
    **options: bool,
) -> dict[tuple[int, ...], float]:
    """Export once, then run the artifact at every combination of SIZES; max error per point."""
    model = model.eval()
    report = torchlower.export(
        model, tuple(example), tmp_path / "m.nnef.tgz", frontend=frontend, dynamic_axes=dynamic_axes,
        **options,
    )  # fmt: skip
    names = [i.name for i in report.inputs]
    axes = {names.index(n): dict(a) for n, a in dynamic_axes.items()}
    symbols = sorted({s for a in dynamic_axes.values() for s in a.values()})
    for info in report.inputs:  # the artifact's inputs really are symbolic
        for axis, symbol in dict(dynamic_axes.get(info.name, {})).items():
            assert info.shape[axis] == symbol
    errors = {}
    for combo in itertools.product(*(SIZES[s] for s in symbols)):
        sizes = dict(zip(symbols, combo, strict=True))
        inputs = at_sizes(example, axes, sizes)
        with torch.no_grad():
            want = model(*inputs)
        want = [want] if isinstance(want, torch.Tensor) else list(want)
        got = run_in_tract(report.path, [t.numpy() for t in inputs])
        assert len(got) == len(want)
        worst = 0.0
        for w, g in zip(want, got, strict=True):
            assert tuple(g.shape) == tuple(w.shape), f"at {sizes}: shape {g.shape} != {tuple(w.shape)}"
            worst = max(worst, float(np.abs(g.astype(np.float64) - w.numpy()).max()))
        assert worst <= tolerance, f"at {sizes}: max |torch - tract| = {worst}"
        errors[combo] = worst
    assert len(errors) >= 3
    return errors


@pytest.fixture(params=DYNAMIC_FRONTENDS)
def dyn_frontend(request: pytest.FixtureRequest) -> str:
    return request.param


def test_cnn_variable_batch(tmp_path, dyn_frontend):
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(128, 5),
    )
    export_dynamic(model, (torch.randn(2, 3, 8, 8),), tmp_path, dyn_frontend, {"input": {0: "B"}})


def test_transformer_encoder(tmp_path, dyn_frontend):
    layer = nn.TransformerEncoderLayer(d_model=16, nhead=4, dim_feedforward=32, dropout=0.0, batch_first=True)
    model = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
    export_dynamic(model, (torch.randn(2, 7, 16),), tmp_path, dyn_frontend, {"src": {0: "B", 1: "S"}})


def _text_model(name: str) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    from tests.test_models_transformers import MODELS

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, (ids, mask) = MODELS[name]()
    return model, (ids, torch.ones_like(mask))


class TinyGPT(nn.Module):
    """A decoder written the way FX can trace it: positions and the causal mask come from the
    sequence length at run time (``ids.size(1)``), never from the example."""

    def __init__(self, vocab: int = 50, dim: int = 16, heads: int = 2, context: int = 32) -> None:
        super().__init__()
        self.heads = heads
        self.tokens, self.positions = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        batch, length = ids.size(0), ids.size(1)
        pos = torch.arange(length, device=ids.device)
        x = self.tokens(ids) + self.positions(pos)
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        split = lambda t: t.reshape(batch, length, self.heads, -1).transpose(1, 2)  # noqa: E731
        scores = split(q) @ split(k).transpose(-1, -2) / (q.size(-1) // self.heads) ** 0.5
        causal = pos[None, :] > pos[:, None]
        weights = scores.masked_fill(causal, float("-inf")).softmax(-1)
        x = x + self.proj((weights @ split(v)).transpose(1, 2).reshape(batch, length, -1))
        return self.head(x + self.mlp(self.norm2(x)))


def test_tiny_gpt_variable_batch_and_sequence(tmp_path, dyn_frontend):
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 7))
    export_dynamic(TinyGPT(), (ids,), tmp_path, dyn_frontend, {"ids": {0: "B", 1: "S"}})


class OnesMask(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.size(1)
        mask = torch.ones((n, n), dtype=torch.bool).triu(1)  # FX cannot trace torch.ones(n, n)
        return x.unsqueeze(1).expand(-1, n, -1).masked_fill(mask, 0.0) + torch.full((n,), 0.5)


def test_creation_ops_with_a_symbolic_size(tmp_path, dyn_frontend):
    """``torch.ones((S, S))`` / ``torch.full((S,), v)`` are built in the graph from the input's size."""
    export_dynamic(OnesMask(), (torch.randn(2, 6),), tmp_path, dyn_frontend, {"x": {0: "B", 1: "S"}})


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_decoder_variable_batch_and_sequence(tmp_path, dyn_frontend, name):
    pytest.importorskip("transformers")
    if dyn_frontend == "fx":
        pytest.skip("torch.fx cannot trace transformers models (Python control flow on tensors)")
    model, args = _text_model(name)
    axes = {"input_ids": {0: "B", 1: "S"}, "attention_mask": {0: "B", 1: "S"}}
    # transformers skips the mask when it is all ones (masking_utils: `padding_mask.all()`), a
    # branch on a value; the example is padded, so the trace keeps the general masked path
    options = {"allow_value_dependent_trace": True} if dyn_frontend == "jit" else {}
    export_dynamic(model, args, tmp_path, dyn_frontend, axes, **options)


def test_unknown_input_and_axis_are_rejected(tmp_path):
    model = nn.Linear(4, 2)
    x = torch.randn(2, 4)
    with pytest.raises(InvalidArgumentError, match="unknown input 'y'"):
        torchlower.export(model, x, tmp_path / "m.nnef.tgz", dynamic_axes={"y": {0: "B"}})
    with pytest.raises(InvalidArgumentError, match="axis 2 does not exist"):
        torchlower.export(model, x, tmp_path / "m.nnef.tgz", dynamic_axes={"input": {2: "B"}})


class Branchy(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[1] > 7 else x + 1


class BranchOutsideTheMoves(nn.Module):
    """Branches at a size the first captures (7, 8, 10) do not reach: seen at the check's sizes."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[1] >= 5 else x * 3


class PythonSize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.from_numpy(np.ones(x.shape[1], np.float32))  # built in Python: baked in the trace


def test_branching_on_a_dynamic_dim_names_input_axis_and_op(tmp_path):
    with pytest.raises(LoweringError, match=r"input 'x' axis 1 \(S\) cannot be dynamic.*(branches|aten::)"):
        torchlower.export(
            Branchy(),
            torch.randn(2, 7),
            tmp_path / "m.nnef.tgz",
            frontend="jit",
            dynamic_axes={"x": {1: "S"}},
        )
    with pytest.raises(
        LoweringError, match=r"input 'x' axis 1 \(S\) cannot be dynamic: a constant used by aten::"
    ):
        torchlower.export(
            PythonSize(),
            torch.randn(2, 7),
            tmp_path / "m.nnef.tgz",
            frontend="jit",
            dynamic_axes={"x": {1: "S"}},
        )


def test_branch_seen_only_at_other_sizes_names_input_axis_op_and_line(tmp_path):
    with pytest.raises(LoweringError) as caught:
        torchlower.export(
            BranchOutsideTheMoves(),
            torch.randn(2, 7),
            tmp_path / "m.nnef.tgz",
            frontend="jit",
            dynamic_axes={"x": {1: "S"}},
        )
    message = str(caught.value)
    assert "input 'x' axis 1 (S) cannot be dynamic" in message
    assert "aten::mul" in message
    assert f"test_dynamic.py:{BranchOutsideTheMoves.forward.__code__.co_firstlineno + 1}" in message
    assert not (tmp_path / "m.nnef.tgz").exists()


def test_export_dynamic_shapes_with_dim(tmp_path):
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 3)).eval()
    x = torch.randn(2, 5, 8)
    b, s = torch.export.Dim("B"), torch.export.Dim("S")
    report = torchlower.export(
        model, x, tmp_path / "m.nnef.tgz", frontend="export", dynamic_shapes={"input": {0: b, 1: s}}
    )
    assert report.inputs[0].shape == ("B", "S", 8)
    for sizes in ({"B": 1, "S": 1}, {"B": 3, "S": 4}, {"B": 5, "S": 9}):
        (xi,) = at_sizes((x,), {0: {0: "B", 1: "S"}}, sizes)
        got = run_in_tract(report.path, [xi.numpy()])[0]
        assert np.abs(got - model(xi).detach().numpy()).max() <= 1e-4


def test_report_shows_symbolic_output_shapes(tmp_path, dyn_frontend):
    model = nn.Sequential(nn.Linear(8, 3), nn.ReLU()).eval()
    report = torchlower.export(
        model, torch.randn(2, 5, 8), tmp_path / "m.nnef.tgz", frontend=dyn_frontend,
        dynamic_axes={"input": {0: "B", 1: "S"}},
    )  # fmt: skip
    assert report.inputs[0].shape == ("B", "S", 8)
    assert report.outputs[0].shape == ("B", "S", 3)


def test_far_capture_point_beyond_the_context_is_skipped(tmp_path, dyn_frontend):
    """Captures also run at a far size (2·S + 7 = 21 here) to catch branches; a model whose
    positions stop at 16 cannot run there, which must not fail the export."""
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 7))
    export_dynamic(TinyGPT(context=16), (ids,), tmp_path, dyn_frontend, {"ids": {0: "B", 1: "S"}})


class _PositionTable(nn.Module):
    """BERT's shape of failure: positions from a table of 8 (S <= 8 under export) and a value
    check Python evaluates outside export (jit bakes it)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.arange(8.0).reshape(1, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_exporting() and bool((x.abs() >= 0).all()):
            x = x * 1.0
        return x + self.table[:, : x.shape[1]].expand(x.shape[0], x.shape[1])


def test_auto_adopts_the_dynamic_bound_the_model_needs(tmp_path: Path) -> None:
    """jit cannot keep the position table's size symbolic; torch.export suggests S <= 8 and
    PyTorch fails at S=9, so that bound is declared for the user (noted) and the export succeeds."""
    report = torchlower.export(
        _PositionTable(), torch.randn(2, 5), tmp_path / "p.nnef.tgz", dynamic_axes={"x": {1: "S"}}
    )
    assert report.frontend == "export" and report.max_abs_error < 1e-6
    assert any("S <= 8" in n for n in report.notes), report.notes


class _PythonSizeAndValue(nn.Module):
    """export: a size taken into numpy (no bound helps); jit: a value check outside export."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not torch.compiler.is_exporting() and bool((x.abs() >= 0).all()):
            x = x * 1.0
        return x + torch.from_numpy(np.ones(x.shape[1], np.float32))


def test_auto_reports_the_dynamic_axis_error_first(tmp_path: Path) -> None:
    """Every front end fails: the error raised is the dynamic-axis one (an argument fixes it),
    the other front ends' reasons are notes, and no file is left."""
    from torchlower.errors import DynamicAxisError

    with pytest.raises(DynamicAxisError, match=r"input 'x' axis 1 \(S\) cannot be dynamic") as caught:
        torchlower.export(
            _PythonSizeAndValue(), torch.randn(2, 7), tmp_path / "m.nnef.tgz", dynamic_axes={"x": {1: "S"}}
        )
    assert any("jit front end skipped" in n for n in caught.value.__notes__)
    assert not (tmp_path / "m.nnef.tgz").exists()


class SortRows(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sort(x, dim=1).values


@pytest.mark.parametrize("frontend", ["export", "fx"])
def test_sort_along_a_dynamic_axis_is_a_clear_error(tmp_path, frontend):
    """tract's topk needs a fixed k: the error names the op and the fix, nothing is written."""
    with pytest.raises(LoweringError, match=r"aten::sort at .*size S depends on a dynamic axis.*axis static"):
        torchlower.export(
            SortRows(),
            torch.randn(2, 7),
            tmp_path / "m.nnef.tgz",
            frontend=frontend,
            dynamic_axes={"x": {1: "S"}},
        )
    assert list(tmp_path.iterdir()) == []
    report = torchlower.export(
        SortRows(), torch.randn(2, 7), tmp_path / "m.nnef.tgz", dynamic_axes={"x": {0: "B"}}
    )
    assert report.errors and all(e.ok for e in report.errors)

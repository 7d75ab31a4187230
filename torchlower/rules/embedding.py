"""Table lookups: embedding, embedding_bag, one_hot.

``embedding_bag`` is a gather followed by a bag-membership matrix product: bag ``b`` owns
positions ``offsets[b] <= i < offsets[b+1]``. With constant offsets the matrix is built at
export time; with offsets as a graph input it is built in the graph from comparisons.
"""

from __future__ import annotations

import torch
from torch import nn

from torchlower.core.values import MISSING, Value, constant
from torchlower.errors import LoweringError
from torchlower.rules import module_rule, rule
from torchlower.rules.common import Builder, shape_of

_BAG_MODES = {0: "sum", 1: "mean", 2: "max"}


@rule("aten::embedding")
def embedding(
    b: Builder, weight: Value, indices: Value, padding_idx: int, scale_grad_by_freq: bool, sparse: bool
) -> Value:
    """embedding(Tensor weight, Tensor indices, SymInt padding_idx=-1, bool scale_grad_by_freq=False,
    bool sparse=False) -> Tensor"""
    # padding_idx, scale_grad_by_freq and sparse only change gradients: inference ignores them
    shape = (*shape_of(indices), *shape_of(weight)[1:])
    return b.call("tract_core_gather", [weight, indices], {"axis": 0}, dtype=weight.dtype, shape=shape)


@rule("aten::one_hot")
def one_hot(b: Builder, x: Value, num_classes: int) -> Value:
    """one_hot(Tensor self, int num_classes=-1) -> Tensor"""
    if num_classes < 0:
        raise LoweringError("one_hot: num_classes=-1 depends on the data; pass num_classes explicitly")
    shape = (*shape_of(x), num_classes)
    attrs = {"axis": x.rank, "dim": num_classes, "value_off": 0, "value_on": 1}
    return b.call("tract_core_one_hot", [x], attrs, dtype=torch.int64, shape=shape)


@rule("aten::embedding_bag", "aten::_embedding_bag")
def embedding_bag(
    b: Builder,
    weight: Value,
    indices: Value,
    offsets: Value,
    scale_grad_by_freq: bool,
    mode: int,
    sparse: bool,
    per_sample_weights: Value | None,
    include_last_offset: bool,
    padding_idx: int | None = None,
) -> tuple[object, ...]:
    """embedding_bag(Tensor weight, Tensor indices, Tensor offsets, bool scale_grad_by_freq=False,
    int mode=0, bool sparse=False, Tensor? per_sample_weights=None, bool include_last_offset=False)
    -> (Tensor, Tensor, Tensor, Tensor); the .padding_idx overload adds int? padding_idx"""
    if indices.rank != 1:
        raise LoweringError(f"embedding_bag: expected 1-D indices with offsets, got rank {indices.rank}")
    if mode not in _BAG_MODES:
        raise LoweringError(f"embedding_bag: mode must be 0 (sum), 1 (mean) or 2 (max), got {mode}")
    if per_sample_weights is not None and mode != 0:
        raise LoweringError("embedding_bag: per_sample_weights needs mode='sum' (as in PyTorch)")
    n, dim = shape_of(indices)[0], shape_of(weight)[1]
    rows = embedding(b, weight, indices, -1, False, False)  # (N, D)
    member = _membership(b, offsets, n, include_last_offset)  # (B, N) float 0/1
    if padding_idx is not None and padding_idx >= 0:
        keep = b.call("ne", [indices, padding_idx], dtype=torch.bool, shape=(n,))
        keep = b.call("select", [keep, 1.0, 0.0], dtype=weight.dtype, shape=(n,))
        member = b.call("mul", [member, _row(b, keep)], dtype=weight.dtype, shape=member.shape)
    bags = shape_of(member)[0]
    if _BAG_MODES[mode] == "max":
        out = _bag_max(b, rows, member)
    else:
        if per_sample_weights is not None:
            member = b.call(
                "mul", [member, _row(b, per_sample_weights)], dtype=weight.dtype, shape=member.shape
            )
        if _BAG_MODES[mode] == "mean":
            count = b.call("sum_reduce", [member], {"axes": [1]}, dtype=weight.dtype, shape=(bags, 1))
            count = b.call("max", [count, 1.0], dtype=weight.dtype, shape=(bags, 1))
            member = b.call("div", [member, count], dtype=weight.dtype, shape=member.shape)
        out = b.call("matmul", [member, rows], {"transposeA": False, "transposeB": False}, dtype=weight.dtype)
    out = out.with_meta(weight.dtype, (bags, dim))
    # offset2bag / bag_size / max_indices only serve the backward pass: not lowered
    return out, MISSING, MISSING, MISSING


@module_rule(nn.EmbeddingBag)
def embedding_bag_module(
    b: Builder,
    m: nn.EmbeddingBag,
    x: Value,
    offsets: Value | None = None,
    per_sample_weights: Value | None = None,
) -> Value:
    """nn.EmbeddingBag forward; a 2-D input is one bag per row (offsets must then be None)."""
    if m.max_norm is not None:
        raise LoweringError("EmbeddingBag: max_norm renormalizes weights at run time; export without it")
    if x.rank == 2:
        if offsets is not None:
            raise LoweringError("EmbeddingBag: offsets must be None with 2-D input")
        rows, per_bag = shape_of(x)
        offsets = constant(torch.arange(0, int(rows) * int(per_bag), int(per_bag)))
        x = b.call("reshape", [x], {"shape": [-1]}, dtype=x.dtype, shape=(int(rows) * int(per_bag),))
        if per_sample_weights is not None:
            per_sample_weights = b.call("reshape", [per_sample_weights], {"shape": [-1]}, dtype=x.dtype)
            per_sample_weights = per_sample_weights.with_meta(None, (int(rows) * int(per_bag),))
    if offsets is None:
        raise LoweringError("EmbeddingBag: 1-D input needs offsets")
    mode = {"sum": 0, "mean": 1, "max": 2}[m.mode]
    weight = constant(m.weight.detach(), label="weight")
    return embedding_bag(
        b, weight, x, offsets, False, mode, False, per_sample_weights, m.include_last_offset, m.padding_idx
    )[0]  # type: ignore[return-value]


def _row(b: Builder, v: Value) -> Value:
    if v.is_const:
        return constant(v.const.reshape(1, -1).to(torch.float32))
    return b.call("unsqueeze", [v], {"axes": [0]}, dtype=v.dtype, shape=(1, *shape_of(v)))


def _membership(b: Builder, offsets: Value, n: int, include_last_offset: bool) -> Value:
    """``M[b, i] = 1.0`` when position ``i`` belongs to bag ``b``."""
    if offsets.is_const:
        starts = offsets.const.to(torch.int64)
        ends = torch.cat([starts[1:], torch.tensor([n])])
        if include_last_offset:
            starts, ends = starts[:-1], starts[1:]
        i = torch.arange(n)
        return constant(((i >= starts[:, None]) & (i < ends[:, None])).to(torch.float32))
    count = shape_of(offsets)[0]
    bags = count - 1 if include_last_offset else count
    starts = b.call("slice", [offsets], {"axes": [0], "begin": [0], "end": [bags]}, dtype=torch.int64)
    tail = b.call("slice", [offsets], {"axes": [0], "begin": [1], "end": [count]}, dtype=torch.int64)
    if not include_last_offset:
        tail = b.call("concat", [[tail, constant(torch.tensor([n]))]], {"axis": 0}, dtype=torch.int64)
    starts = b.call("unsqueeze", [starts], {"axes": [1]}, dtype=torch.int64, shape=(bags, 1))
    ends = b.call("unsqueeze", [tail], {"axes": [1]}, dtype=torch.int64, shape=(bags, 1))
    i = constant(torch.arange(n).reshape(1, n))
    inside = b.call(
        "and",
        [b.call("ge", [i, starts], dtype=torch.bool), b.call("lt", [i, ends], dtype=torch.bool)],
        dtype=torch.bool,
    )
    return b.call("select", [inside, 1.0, 0.0], dtype=torch.float32, shape=(bags, n))


def _bag_max(b: Builder, rows: Value, member: Value) -> Value:
    """Max over each bag's rows; an empty bag gives zeros, as in PyTorch."""
    bags, n = shape_of(member)
    dim = shape_of(rows)[1]
    inside = b.call("gt", [b.call("unsqueeze", [member], {"axes": [2]}), 0.0], dtype=torch.bool)
    rows3 = b.call("unsqueeze", [rows], {"axes": [0]}, dtype=rows.dtype, shape=(1, n, dim))
    masked = b.call("select", [inside, rows3, -3.4028234663852886e38], dtype=rows.dtype, shape=(bags, n, dim))
    top = b.call("max_reduce", [masked], {"axes": [1]}, dtype=rows.dtype, shape=(bags, 1, dim))
    top = b.call("squeeze", [top], {"axes": [1]}, dtype=rows.dtype, shape=(bags, dim))
    filled = b.call("sum_reduce", [member], {"axes": [1]}, dtype=member.dtype, shape=(bags, 1))
    nonempty = b.call("gt", [filled, 0.0], dtype=torch.bool, shape=(bags, 1))
    return b.call("select", [nonempty, top, 0.0], dtype=rows.dtype, shape=(bags, dim))

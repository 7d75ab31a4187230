"""More layout: fill/zero, swapaxes, tensor_split family, channel_shuffle, repeat_interleave,
diff, diagonals (diagonal, diag_embed, diag, trace) and take / take_along_dim.

Every index is resolved at export time from static shapes, so tract only sees slices,
concats, transposes and gathers with constant indices.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from torchlower.core.values import Value, constant, normalize_dim
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder, cast, reshape
from torchlower.rules.creation import filled
from torchlower.rules.indexing import gather
from torchlower.rules.layout import (
    broadcast_to,
    concat,
    dims_of,
    gather_axis,
    slice_dim,
    transpose,
    unsqueeze,
)


@rule("aten::fill.Scalar", "aten::fill_.Scalar")
def fill(b: Builder, x: Value, value: float | int | bool) -> Value:
    """fill.Scalar(Tensor self, Scalar value) -> Tensor"""
    return filled(b, value, dims_of(x), x.dtype)


@rule("aten::fill.Tensor", "aten::fill_.Tensor")
def fill_tensor(b: Builder, x: Value, value: Value) -> Value:
    """fill.Tensor(Tensor self, Tensor value) -> Tensor: a 0-d ``value`` (a graph value too)."""
    if value.is_const:
        return filled(b, value.const.item(), dims_of(x), x.dtype)
    return broadcast_to(b, cast(b, value, x.dtype), dims_of(x), x.dtype)


@rule("aten::copy", "aten::copy_")
def copy(b: Builder, x: Value, src: Value, non_blocking: bool) -> Value:
    """copy(Tensor self, Tensor src, bool non_blocking=False) -> Tensor

    ``x[...] = src``: ``src`` broadcast to ``x``'s shape, in ``x``'s dtype (the front ends
    scatter the result back when ``x`` is a view).
    """
    if isinstance(src, Value) and src.is_const and src.const.dim() == 0:
        return filled(b, src.const.item(), dims_of(x), x.dtype)
    return broadcast_to(b, cast(b, src, x.dtype), dims_of(x), x.dtype)


@rule("aten::zero", "aten::zero_")
def zero(b: Builder, x: Value) -> Value:
    """zero(Tensor self) -> Tensor"""
    return filled(b, 0, dims_of(x), x.dtype)


@rule("aten::swapaxes", "aten::swapdims")
def swapaxes(b: Builder, x: Value, dim0: int, dim1: int) -> Value:
    """swapaxes(Tensor(a) self, int axis0, int axis1) -> Tensor(a)"""
    perm = list(range(x.rank))
    i, j = normalize_dim(dim0, x.rank), normalize_dim(dim1, x.rank)
    perm[i], perm[j] = perm[j], perm[i]
    return transpose(b, x, perm)


def _split_at(b: Builder, x: Value, bounds: Sequence[int], dim: int) -> list[Value]:
    """Pieces ``x[b_k:b_{k+1}]`` on ``dim``; an empty piece is an empty slice (``slice_dim``)."""
    dim = normalize_dim(dim, x.rank)
    n = dims_of(x)[dim]
    edges = [0, *(min(max(int(i) + (n if int(i) < 0 else 0), 0), n) for i in bounds), n]
    out = []
    for start, end in itertools.pairwise(edges):
        out.append(slice_dim(b, x, dim, start, max(start, end)))
    return out


@rule("aten::tensor_split.sections")
def tensor_split_sections(b: Builder, x: Value, sections: int, dim: int) -> list[Value]:
    """tensor_split.sections(Tensor(a -> *) self, SymInt sections, int dim=0) -> Tensor(a)[]"""
    n = dims_of(x)[normalize_dim(dim, x.rank)]
    size, extra = divmod(n, int(sections))
    sizes = [size + 1] * extra + [size] * (int(sections) - extra)
    return _split_at(b, x, [sum(sizes[:k]) for k in range(1, len(sizes))], dim)


@rule("aten::tensor_split.indices")
def tensor_split_indices(b: Builder, x: Value, indices: Sequence[int], dim: int) -> list[Value]:
    """tensor_split.indices(Tensor(a -> *) self, SymInt[] indices, int dim=0) -> Tensor(a)[]"""
    return _split_at(b, x, indices, dim)


def _even_split(b: Builder, x: Value, sections: int | Sequence[int], dim: int, name: str) -> list[Value]:
    if isinstance(sections, int):
        n = dims_of(x)[dim]
        if sections <= 0 or n % sections:
            raise LoweringError(f"{name}: sections={sections} must divide dim {dim} of size {n}")
        return tensor_split_sections(b, x, sections, dim)
    return _split_at(b, x, sections, dim)


@rule("aten::hsplit.int", "aten::hsplit.array")
def hsplit(b: Builder, x: Value, sections: int | Sequence[int]) -> list[Value]:
    """hsplit.int(Tensor(a -> *) self, int sections) -> Tensor(a)[] (also .array)"""
    return _even_split(b, x, sections, 1 if x.rank > 1 else 0, "hsplit")


@rule("aten::vsplit.int", "aten::vsplit.array")
def vsplit(b: Builder, x: Value, sections: int | Sequence[int]) -> list[Value]:
    """vsplit.int(Tensor(a -> *) self, int sections) -> Tensor(a)[] (also .array)"""
    return _even_split(b, x, sections, 0, "vsplit")


@rule("aten::dsplit.int", "aten::dsplit.array")
def dsplit(b: Builder, x: Value, sections: int | Sequence[int]) -> list[Value]:
    """dsplit.int(Tensor(a -> *) self, int sections) -> Tensor(a)[] (also .array)"""
    return _even_split(b, x, sections, 2, "dsplit")


@rule("aten::channel_shuffle", "aten::native_channel_shuffle")
def channel_shuffle(b: Builder, x: Value, groups: int) -> Value:
    """channel_shuffle(Tensor self, SymInt groups) -> Tensor"""
    n, c, *rest = dims_of(x)
    g = int(groups)
    y = reshape(b, x, [n, g, c // g, *rest])
    y = transpose(b, y, [0, 2, 1, *range(3, x.rank + 1)])
    return reshape(b, y, [n, c, *rest])


@rule("aten::repeat_interleave.self_int", "aten::repeat_interleave.self_Tensor")
def repeat_interleave(
    b: Builder, x: Value, repeats: int | Value, dim: int | None, output_size: int | None
) -> Value:
    """repeat_interleave.self_int(Tensor self, SymInt repeats, int? dim=None, *,
    SymInt? output_size=None) -> Tensor  (also .self_Tensor)

    Limits: repeats must be static (an int or a constant tensor). A single count on a dynamic
    dim is a broadcast over a new axis and a reshape, so the size stays symbolic.
    """
    if isinstance(repeats, Value):
        if not repeats.is_const:
            raise LoweringError("repeat_interleave: repeats must be a constant, got a graph tensor")
        repeats = repeats.const
    if dim is None:
        x, dim = reshape(b, x, [_numel(x)]), 0
    dim = normalize_dim(dim, x.rank)
    count = repeats if isinstance(repeats, int) else int(repeats) if repeats.numel() == 1 else None
    if count is not None and not isinstance(dims_of(x)[dim], int):
        shape = list(dims_of(x))
        wide_shape = [*shape[: dim + 1], count, *shape[dim + 1 :]]
        wide = broadcast_to(b, unsqueeze(b, x, [dim + 1]), wide_shape, x.dtype)
        shape[dim] = shape[dim] * count
        return reshape(b, wide, shape)
    index = torch.arange(dims_of(x)[dim]).repeat_interleave(repeats)
    return gather_axis(b, x, constant(index), dim)


def _numel(x: Value) -> int:
    n = 1
    for d in dims_of(x):
        n *= d
    return n


@rule("aten::diff")
def diff(b: Builder, x: Value, n: int, dim: int, prepend: Value | None, append: Value | None) -> Value:
    """diff(Tensor self, int n=1, int dim=-1, Tensor? prepend=None, Tensor? append=None) -> Tensor"""
    dim = normalize_dim(dim, x.rank)
    parts = [p for p in (prepend, x, append) if p is not None]
    x = concat(b, parts, dim) if len(parts) > 1 else x
    op = "ne" if x.dtype == torch.bool else "sub"
    for _ in range(int(n)):
        size = dims_of(x)[dim]
        hi, lo = slice_dim(b, x, dim, 1, size), slice_dim(b, x, dim, 0, size - 1)
        x = b.call(op, [hi, lo], dtype=x.dtype, shape=dims_of(hi))
    return x


def diagonal_index(rows: int, cols: int, offset: int) -> torch.Tensor:
    """Flat (row-major) positions of the ``offset`` diagonal of a rows × cols matrix."""
    r0, c0 = max(-offset, 0), max(offset, 0)
    length = max(min(rows - r0, cols - c0), 0)
    i = torch.arange(length)
    return (r0 + i) * cols + c0 + i


@rule("aten::diagonal")
def diagonal(b: Builder, x: Value, offset: int, dim1: int, dim2: int) -> Value:
    """diagonal(Tensor(a) self, int offset=0, int dim1=0, int dim2=1) -> Tensor(a)"""
    d1, d2 = normalize_dim(dim1, x.rank), normalize_dim(dim2, x.rank)
    rest = [i for i in range(x.rank) if i not in (d1, d2)]
    y = transpose(b, x, [*rest, d1, d2])
    shape = dims_of(y)
    index = diagonal_index(shape[-2], shape[-1], int(offset))
    y = reshape(b, y, [*shape[:-2], shape[-2] * shape[-1]])
    return gather_axis(b, y, constant(index), len(shape) - 2)


@rule("aten::diag_embed")
def diag_embed(b: Builder, x: Value, offset: int, dim1: int, dim2: int) -> Value:
    """diag_embed(Tensor self, int offset=0, int dim1=-2, int dim2=-1) -> Tensor"""
    *lead, length = dims_of(x)
    size = length + abs(int(offset))
    zero = filled(b, 0, [*lead, 1], x.dtype)
    padded = concat(b, [x, zero], len(lead))
    index = torch.full((size * size,), length, dtype=torch.int64)
    index[diagonal_index(size, size, int(offset))] = torch.arange(length)
    y = gather_axis(b, padded, constant(index), len(lead))
    y = reshape(b, y, [*lead, size, size])
    rank = len(lead) + 2
    d1, d2 = normalize_dim(dim1, rank), normalize_dim(dim2, rank)
    perm: list[int | None] = [None] * rank
    perm[d1], perm[d2] = rank - 2, rank - 1
    others = iter(range(rank - 2))
    return transpose(b, y, [p if p is not None else next(others) for p in perm])


@rule("aten::diag")
def diag(b: Builder, x: Value, diagonal_: int) -> Value:
    """diag(Tensor self, int diagonal=0) -> Tensor"""
    if x.rank == 1:
        return diag_embed(b, x, diagonal_, 0, 1)
    if x.rank != 2:
        raise LoweringError(f"diag: input must be 1-D or 2-D, got rank {x.rank}")
    return diagonal(b, x, diagonal_, 0, 1)


@rule("aten::trace")
def trace(b: Builder, x: Value) -> Value:
    """trace(Tensor self) -> Tensor

    Limits: floating-point inputs (torch sums integer traces as int64).
    """
    if x.dtype.is_floating_point is False:
        raise LoweringError(f"trace: input must be floating point, got {x.dtype}")
    d = diagonal(b, x, 0, 0, 1)
    s = b.call("sum_reduce", [d], {"axes": [0]}, dtype=x.dtype, shape=(1,))
    return b.call("squeeze", [s], {"axes": [0]}, dtype=x.dtype, shape=())


@rule("aten::take")
def take(b: Builder, x: Value, index: Value) -> Value:
    """take(Tensor self, Tensor index) -> Tensor

    Limits: negative indices only when the index is a constant.
    """
    n = _numel(x)
    if index.is_const:
        index = constant(torch.where(index.const < 0, index.const + n, index.const))
    return gather_axis(b, reshape(b, x, [n]), index, 0)


@rule("aten::take_along_dim")
def take_along_dim(b: Builder, x: Value, indices: Value, dim: int | None) -> Value:
    """take_along_dim(Tensor self, Tensor indices, int? dim=None) -> Tensor"""
    if dim is None:
        return gather(b, reshape(b, x, [_numel(x)]), 0, reshape(b, indices, [_numel(indices)]), False)
    if x.rank != indices.rank:
        raise LoweringError(f"take_along_dim: ranks of self ({x.rank}) and indices ({indices.rank}) differ")
    dim = normalize_dim(dim, x.rank)
    xs, js = list(dims_of(x)), list(dims_of(indices))
    common = [max(p, q) for p, q in zip(xs, js, strict=True)]
    x = broadcast_to(b, x, [*common[:dim], xs[dim], *common[dim + 1 :]], x.dtype)
    indices = broadcast_to(b, indices, [*common[:dim], js[dim], *common[dim + 1 :]], indices.dtype)
    return gather(b, x, dim, indices, False)

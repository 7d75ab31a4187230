"""Index-wise writes and windows: index_copy / index_add / index_fill, select_scatter,
slice_scatter, diagonal_scatter and Tensor.unfold.

Writes lower onto ``tract_core_scatter_elements`` with an index shaped like the updates (or a
plain concat when the written region is one contiguous block); windows onto one gather.
"""

from __future__ import annotations

import torch

from torchlower.core.values import SymDim, Value, constant, normalize_dim
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder, Scalar, cast, reshape
from torchlower.rules.indexing import scatter_elements
from torchlower.rules.layout import (
    broadcast_to,
    concat,
    dims_of,
    gather_axis,
    scalar_of,
    slice_dim,
    stack,
    transpose,
)
from torchlower.rules.layout_extra import diagonal_index


def _along(b: Builder, index: Value, dim: int, shape: list[int]) -> Value:
    """A 1-D ``index`` laid along ``dim`` and broadcast to ``shape`` (int64, negatives wrapped)."""
    view = [1] * len(shape)
    view[dim] = shape[dim]
    if index.is_const:
        return constant(index.const.to(torch.int64).reshape(view).expand(shape).contiguous())
    return broadcast_to(b, reshape(b, cast(b, index, torch.int64), view), shape, torch.int64)


def _wrapped(index: Value, n: int) -> Value:
    return constant(torch.where(index.const < 0, index.const + n, index.const)) if index.is_const else index


@rule("aten::index_copy", "aten::index_copy_")
def index_copy(b: Builder, x: Value, dim: int, index: Value, source: Value) -> Value:
    """index_copy(Tensor self, int dim, Tensor index, Tensor source) -> Tensor"""
    dim = normalize_dim(dim, x.rank)
    idx = _along(b, _wrapped(index, dims_of(x)[dim]), dim, list(dims_of(source)))
    return scatter_elements(b, x, dim, idx, cast(b, source, x.dtype), "none")


@rule("aten::index_add", "aten::index_add_")
def index_add(b: Builder, x: Value, dim: int, index: Value, source: Value, alpha: Scalar) -> Value:
    """index_add(Tensor self, int dim, Tensor index, Tensor source, *, Scalar alpha=1) -> Tensor"""
    dim = normalize_dim(dim, x.rank)
    source = cast(b, source, x.dtype)
    if alpha != 1:
        source = b.call("mul", [source, scalar_of(alpha, x.dtype, x.rank)], dtype=x.dtype, shape=source.shape)
    idx = _along(b, _wrapped(index, dims_of(x)[dim]), dim, list(dims_of(source)))
    return scatter_elements(b, x, dim, idx, source, "add")


@rule("aten::index_fill.int_Scalar", "aten::index_fill_.int_Scalar", "aten::index_fill.int_Tensor",
      "aten::index_fill_.int_Tensor")  # fmt: skip
def index_fill(b: Builder, x: Value, dim: int, index: Value, value: Scalar | Value) -> Value:
    """index_fill.int_Scalar(Tensor self, int dim, Tensor index, Scalar value) -> Tensor (also .int_Tensor)"""
    dim = normalize_dim(dim, x.rank)
    if isinstance(value, Value):
        if not value.is_const:
            raise LoweringError("index_fill: a tensor value must be a constant 0-d tensor")
        value = value.const.item()
    shape = list(dims_of(x))
    shape[dim] = dims_of(index)[0] if index.rank else 1
    idx = _along(b, _wrapped(index, dims_of(x)[dim]), dim, shape)
    upd = broadcast_to(b, scalar_of(value, x.dtype, x.rank), shape, x.dtype)
    return scatter_elements(b, x, dim, idx, upd, "none")


def _splice(b: Builder, x: Value, block: Value, dim: int, start: int, end: int) -> Value:
    """``x`` with ``x[start:end]`` on ``dim`` replaced by ``block`` (empty sides are skipped)."""
    n = dims_of(x)[dim]
    parts = [slice_dim(b, x, dim, 0, start)] if not (isinstance(start, int) and start <= 0) else []
    parts.append(cast(b, block, x.dtype))
    if not (end == n or (isinstance(end, int) and isinstance(n, int) and end >= n)):
        parts.append(slice_dim(b, x, dim, end, n))  # symbolic bounds (a dynamic dim) are kept
    return concat(b, parts, dim)


@rule("aten::select_scatter")
def select_scatter(b: Builder, x: Value, src: Value, dim: int, index: int) -> Value:
    """select_scatter(Tensor self, Tensor src, int dim, SymInt index) -> Tensor"""
    dim = normalize_dim(dim, x.rank)
    n, i = dims_of(x)[dim], int(index)
    i = i % n if isinstance(n, int) else n + i if i < 0 else i  # from the end of a dynamic dim
    shape = list(dims_of(x))
    shape[dim] = 1
    return _splice(b, x, reshape(b, src, shape), dim, i, i + 1)


@rule("aten::slice_scatter")
def slice_scatter(
    b: Builder, x: Value, src: Value, dim: int, start: int | None, end: int | None, step: int
) -> Value:
    """slice_scatter(Tensor self, Tensor src, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor"""  # noqa: E501
    dim = normalize_dim(dim, x.rank)
    n = dims_of(x)[dim]
    lo, hi, _ = slice(start, end, step).indices(n)
    if step == 1:
        return _splice(b, x, src, dim, lo, hi)
    idx = _along(b, constant(torch.arange(lo, hi, int(step))), dim, list(dims_of(src)))
    return scatter_elements(b, x, dim, idx, cast(b, src, x.dtype), "none")


@rule("aten::diagonal_scatter")
def diagonal_scatter(b: Builder, x: Value, src: Value, offset: int, dim1: int, dim2: int) -> Value:
    """diagonal_scatter(Tensor self, Tensor src, int offset=0, int dim1=0, int dim2=1) -> Tensor"""
    d1, d2 = normalize_dim(dim1, x.rank), normalize_dim(dim2, x.rank)
    rest = [i for i in range(x.rank) if i not in (d1, d2)]
    perm = [*rest, d1, d2]
    y = transpose(b, x, perm)
    shape = list(dims_of(y))
    flat = reshape(b, y, [*shape[:-2], shape[-2] * shape[-1]])
    diag = diagonal_index(shape[-2], shape[-1], int(offset))
    idx = constant(diag.reshape([1] * (len(shape) - 2) + [-1]).expand(dims_of(src)).contiguous())
    flat = scatter_elements(b, flat, len(shape) - 2, idx, cast(b, src, x.dtype), "none")
    y = reshape(b, flat, shape)
    inverse = [perm.index(i) for i in range(x.rank)]
    return transpose(b, y, inverse)


@rule("aten::unfold")
def unfold(b: Builder, x: Value, dimension: int, size: int, step: int) -> Value:
    """unfold(Tensor(a) self, int dimension, int size, int step) -> Tensor(a)

    Windows of ``size`` every ``step`` on ``dimension`` become a new last dim: one gather with a
    constant (windows, size) index, then the window axis moves last. Along a dynamic dim the
    window count is a size expression, so the windows are ``size`` strided slices stacked last.
    """
    dim = normalize_dim(dimension, max(x.rank, 1))
    n = dims_of(x)[dim] if x.rank else 1
    windows = (n - int(size)) // int(step) + 1
    if isinstance(windows, SymDim):
        span = (windows - 1) * int(step) + 1  # positions the first tap of every window covers
        taps = [slice_dim(b, x, dim, k, k + span, int(step)) for k in range(int(size))]
        return stack(b, taps, x.rank)
    if windows <= 0:
        raise LoweringError(f"unfold: size {size} exceeds dim {dim} of size {n}")
    index = torch.arange(windows)[:, None] * int(step) + torch.arange(int(size))[None, :]
    y = gather_axis(b, x, constant(index), dim)
    rank = x.rank + 1
    return transpose(b, y, [*range(dim + 1), *range(dim + 2, rank), dim + 1])

"""Selection: argmax/argmin, max/min along a dim, topk, sort, argsort.

tract's ``argmax_reduce`` keeps the first of tied maxima and its ``tract_core_topk`` sorts
stably, which is what PyTorch does on CPU (and what ``stable=True`` promises).
"""

from __future__ import annotations

import torch

from torchlower.core.values import Value, normalize_dim
from torchlower.errors import LoweringError
from torchlower.rules import nan, rule
from torchlower.rules.common import Builder, reshape
from torchlower.rules.layout import dims_of, squeeze


def _reduce(b: Builder, op: str, x: Value, dim: int, keepdim: bool, dtype: torch.dtype) -> Value:
    shape = list(dims_of(x))
    shape[dim] = 1
    y = b.call(op, [x], {"axes": [dim]}, dtype=dtype, shape=tuple(shape))
    return y if keepdim else squeeze(b, y, [dim])


def _arg(b: Builder, op: str, x: Value, dim: int | None, keepdim: bool) -> Value:
    """tract's argmax / argmin; for floats, a row holding NaN gives its first NaN's index as in
    torch (tract skips NaN: ``rules/nan.py``)."""
    if dim is not None:
        axis = normalize_dim(dim, x.rank)
        y = _reduce(b, op, x, axis, keepdim, torch.int64)
        if not nan.is_float(x):
            return y
        return nan.argext(b, y, x, axis, lambda v: v if keepdim else squeeze(b, v, [axis]))
    flat = reshape(b, x, [int(torch.Size(dims_of(x)).numel())])
    y = _reduce(b, op, flat, 0, True, torch.int64)
    if nan.is_float(x):
        y = nan.argext(b, y, flat, 0, lambda v: v)
    if keepdim:
        return reshape(b, y, [1] * x.rank)
    return squeeze(b, y, [0])  # tract cannot reshape to rank 0: squeeze


@rule("aten::argmax")
def argmax(b: Builder, x: Value, dim: int | None, keepdim: bool) -> Value:
    """argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor"""
    return _arg(b, "argmax_reduce", x, dim, keepdim)


@rule("aten::argmin")
def argmin(b: Builder, x: Value, dim: int | None, keepdim: bool) -> Value:
    """argmin(Tensor self, int? dim=None, bool keepdim=False) -> Tensor"""
    return _arg(b, "argmin_reduce", x, dim, keepdim)


@rule("aten::max.dim")
def max_dim(b: Builder, x: Value, dim: int, keepdim: bool) -> tuple[Value, Value]:
    """max.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)"""
    dim = normalize_dim(dim, x.rank)
    return _reduce(b, "max_reduce", x, dim, keepdim, x.dtype), _arg(b, "argmax_reduce", x, dim, keepdim)


@rule("aten::min.dim")
def min_dim(b: Builder, x: Value, dim: int, keepdim: bool) -> tuple[Value, Value]:
    """min.dim(Tensor self, int dim, bool keepdim=False) -> (Tensor values, Tensor indices)"""
    dim = normalize_dim(dim, x.rank)
    return _reduce(b, "min_reduce", x, dim, keepdim, x.dtype), _arg(b, "argmin_reduce", x, dim, keepdim)


def topk_values(b: Builder, x: Value, k: int, dim: int, largest: bool) -> tuple[Value, Value]:
    """Both results of ``tract_core_topk`` (sorted, stable), with their shapes."""
    dim = normalize_dim(dim, x.rank)
    shape = list(dims_of(x))
    if not isinstance(shape[dim], int):
        raise LoweringError(
            f"sort/topk along dim {dim}, whose size {shape[dim]} depends on a dynamic axis: "
            "tract_core_topk needs a fixed length; export with that axis static"
        )
    if not 0 <= k <= shape[dim]:  # k = 0: tract's topk gives the empty results torch does
        raise LoweringError(f"topk: k = {k} must be in [0, {shape[dim]}] for dim {dim}")
    shape[dim] = k
    values, indices = b.call_multi("tract_core_topk", [x], {"k": k, "axis": dim, "largest": largest}, 2)
    return values.with_meta(x.dtype, tuple(shape)), indices.with_meta(torch.int64, tuple(shape))


@rule("aten::topk")
def topk(b: Builder, x: Value, k: int, dim: int, largest: bool, sorted: bool) -> tuple[Value, Value]:
    """topk(Tensor self, SymInt k, int dim=-1, bool largest=True, bool sorted=True) -> (Tensor values, Tensor indices)"""  # noqa: E501
    # sorted=False leaves the order unspecified: the sorted order tract gives is one valid answer
    return topk_values(b, x, int(k), dim, largest)


@rule("aten::sort")
def sort(b: Builder, x: Value, dim: int, descending: bool) -> tuple[Value, Value]:
    """sort(Tensor self, int dim=-1, bool descending=False) -> (Tensor values, Tensor indices)"""
    return topk_values(b, x, dims_of(x)[normalize_dim(dim, x.rank)], dim, descending)


@rule("aten::sort.stable")
def sort_stable(b: Builder, x: Value, stable: bool | None, dim: int, descending: bool) -> tuple[Value, Value]:
    """sort.stable(Tensor self, *, bool? stable, int dim=-1, bool descending=False) -> (Tensor values, Tensor indices)"""  # noqa: E501
    return sort(b, x, dim, descending)  # tract's sort is stable, so stable=True is honoured


@rule("aten::argsort")
def argsort(b: Builder, x: Value, dim: int, descending: bool) -> Value:
    """argsort(Tensor self, int dim=-1, bool descending=False) -> Tensor"""
    return sort(b, x, dim, descending)[1]


@rule("aten::argsort.stable")
def argsort_stable(b: Builder, x: Value, stable: bool, dim: int, descending: bool) -> Value:
    """argsort.stable(Tensor self, *, bool stable, int dim=-1, bool descending=False) -> Tensor"""
    return sort(b, x, dim, descending)[1]

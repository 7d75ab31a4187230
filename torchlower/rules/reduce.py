"""Reductions over dim lists: mean, sum, amax, amin (NNEF reductions keep dims; squeeze after)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torchlower.core.values import Value, normalize_dim
from torchlower.rules import rule
from torchlower.rules.common import Builder, cast, shape_of


def _reduce(
    b: Builder,
    op: str,
    x: Value,
    dim: int | Sequence[int] | None,
    keepdim: bool,
    dtype: torch.dtype | None = None,
) -> Value:
    if dtype is not None:
        x = cast(b, x, dtype)
    dims = [dim] if isinstance(dim, int) else list(dim or [])
    axes = sorted({normalize_dim(d, x.rank) for d in dims}) if dims else list(range(x.rank))
    if not axes:  # a rank-0 tensor reduces to itself
        return x
    shape = tuple(1 if i in axes else d for i, d in enumerate(shape_of(x)))
    y = b.call(op, [x], {"axes": axes}, dtype=x.dtype, shape=shape)
    if keepdim:
        return y
    out = tuple(d for i, d in enumerate(shape_of(x)) if i not in axes)
    return b.call("squeeze", [y], {"axes": axes}, dtype=x.dtype, shape=out)


@rule("aten::mean.dim", "aten::mean")
def mean(
    b: Builder,
    x: Value,
    dim: Sequence[int] | None = None,
    keepdim: bool = False,
    dtype: torch.dtype | None = None,
) -> Value:
    """mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor"""
    if isinstance(dim, torch.dtype):
        dim, dtype = None, dim  # mean(Tensor self, *, ScalarType? dtype=None)
    return _reduce(b, "mean_reduce", x, dim, keepdim, dtype)


@rule("aten::sum.dim_IntList", "aten::sum")
def sum_(
    b: Builder,
    x: Value,
    dim: Sequence[int] | None = None,
    keepdim: bool = False,
    dtype: torch.dtype | None = None,
) -> Value:
    """sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor

    Integer and bool inputs accumulate in int64, like torch.
    """
    if isinstance(dim, torch.dtype):
        dim, dtype = None, dim  # sum(Tensor self, *, ScalarType? dtype=None)
    if dtype is None and x.dtype is not None and not x.dtype.is_floating_point:
        dtype = torch.int64
    return _reduce(b, "sum_reduce", x, dim, keepdim, dtype)


@rule("aten::amax")
def amax(b: Builder, x: Value, dim: Sequence[int] = (), keepdim: bool = False) -> Value:
    """amax(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor  ([] = every dim)"""
    return _reduce(b, "max_reduce", x, dim, keepdim)


@rule("aten::amin")
def amin(b: Builder, x: Value, dim: Sequence[int] = (), keepdim: bool = False) -> Value:
    """amin(Tensor self, int[1] dim=[], bool keepdim=False) -> Tensor  ([] = every dim)"""
    return _reduce(b, "min_reduce", x, dim, keepdim)

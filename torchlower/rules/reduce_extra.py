"""Reductions beyond sum/mean/amax/amin: global min/max, prod, logsumexp, var/std, norms, aminmax.

NNEF reductions keep the reduced axes, so every rule reduces with kept dims and squeezes at the
end unless ``keepdim``. Statistics over a dynamic dim read its count at run time.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from torchlower.core.values import Dim, Value, normalize_dim
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder, shape_of, size_tensor
from torchlower.rules.math import binary, cast, floating, maximum, minimum, unary

Dims = int | Sequence[int] | None


def axes_of(x: Value, dim: Dims) -> list[int]:
    """Sorted non-negative axes; None or an empty list means every axis (torch's convention)."""
    if dim is None or (not isinstance(dim, int) and not dim):
        return list(range(x.rank))
    dims = [dim] if isinstance(dim, int) else list(dim)
    return sorted({normalize_dim(d, x.rank) for d in dims})


def reduce(b: Builder, op: str, x: Value, axes: list[int], dtype: torch.dtype | None = None) -> Value:
    """An NNEF reduction with kept dims (a no-op on rank 0)."""
    if not axes:
        return x
    shape = tuple(1 if i in axes else d for i, d in enumerate(shape_of(x)))
    return b.call(op, [x], {"axes": axes}, dtype=dtype or x.dtype, shape=shape)


def finish(b: Builder, y: Value, axes: list[int], keepdim: bool) -> Value:
    """Drop the kept reduced axes unless ``keepdim``."""
    if keepdim or not axes:
        return y
    shape = tuple(d for i, d in enumerate(shape_of(y)) if i not in axes)
    return b.call("squeeze", [y], {"axes": axes}, dtype=y.dtype, shape=shape)


def size_product(x: Value, axes: list[int]) -> Dim:
    """The element count of the reduced axes: an int, or a size expression when one is dynamic."""
    n: Dim = 1
    for a in axes:
        n = n * shape_of(x)[a]
    return n


# ---- min / max ------------------------------------------------------------------------------


@rule("aten::max")
def max_all(b: Builder, x: Value) -> Value:
    """max(Tensor self) -> Tensor (the dim overload returning indices is a selection rule)"""
    axes = axes_of(x, None)
    return finish(b, reduce(b, "max_reduce", x, axes), axes, False)


@rule("aten::min")
def min_all(b: Builder, x: Value) -> Value:
    """min(Tensor self) -> Tensor"""
    axes = axes_of(x, None)
    return finish(b, reduce(b, "min_reduce", x, axes), axes, False)


@rule("aten::max.other")
def max_other(b: Builder, x: Value, other: Value) -> Value:
    """max.other(Tensor self, Tensor other) -> Tensor (elementwise, like maximum: NaN kept)"""
    return maximum(b, x, other)


@rule("aten::min.other")
def min_other(b: Builder, x: Value, other: Value) -> Value:
    """min.other(Tensor self, Tensor other) -> Tensor (elementwise, like minimum: NaN kept)"""
    return minimum(b, x, other)


@rule("aten::aminmax")
def aminmax(b: Builder, x: Value, dim: int | None = None, keepdim: bool = False) -> tuple[Value, Value]:
    """aminmax(Tensor self, *, int? dim=None, bool keepdim=False) -> (Tensor min, Tensor max)"""
    axes = axes_of(x, dim)
    lo = finish(b, reduce(b, "min_reduce", x, axes), axes, keepdim)
    hi = finish(b, reduce(b, "max_reduce", x, axes), axes, keepdim)
    return lo, hi


# ---- prod / logsumexp -----------------------------------------------------------------------


def _prod_input(b: Builder, x: Value, dtype: torch.dtype | None) -> Value:
    if dtype is None and x.dtype is not None and not x.dtype.is_floating_point:
        dtype = torch.int64  # torch multiplies integers and bools in int64
    return cast(b, x, dtype) if dtype is not None else x


@rule("aten::prod")
def prod(b: Builder, x: Value, dtype: torch.dtype | None = None) -> Value:
    """prod(Tensor self, *, ScalarType? dtype=None) -> Tensor"""
    x = _prod_input(b, x, dtype)
    axes = axes_of(x, None)
    return finish(b, reduce(b, "tract_core_product_reduce", x, axes), axes, False)


@rule("aten::prod.dim_int")
def prod_dim(
    b: Builder, x: Value, dim: int, keepdim: bool = False, dtype: torch.dtype | None = None
) -> Value:
    """prod.dim_int(Tensor self, int dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor"""
    x = _prod_input(b, x, dtype)
    axes = axes_of(x, dim)
    return finish(b, reduce(b, "tract_core_product_reduce", x, axes), axes, keepdim)


@rule("aten::logsumexp")
def logsumexp(b: Builder, x: Value, dim: Dims, keepdim: bool = False) -> Value:
    """logsumexp(Tensor self, int[1] dim, bool keepdim=False) -> Tensor

    Lowered stably as m + log(sum(exp(x - m))) with m = max (tract aborts on its own
    logsumexp); an infinite max is replaced by 0 as torch does, so all -inf gives -inf."""
    x = floating(b, x)
    axes = axes_of(x, dim)
    top = reduce(b, "max_reduce", x, axes)
    infinite = b.call("tract_core_is_inf", [top], dtype=torch.bool, shape=top.shape)
    safe = b.call("select", [infinite, 0.0, top], dtype=x.dtype, shape=top.shape)
    total = reduce(b, "sum_reduce", unary(b, "exp", binary(b, "sub", x, safe)), axes)
    return finish(b, binary(b, "add", unary(b, "log", total), safe), axes, keepdim)


# ---- var / std ------------------------------------------------------------------------------


def _variance(
    b: Builder, x: Value, dim: Dims, correction: float, keepdim: bool, root: bool = False
) -> tuple[Value, Value]:
    """(variance, mean) with torch's correction (1 = unbiased), reduced over ``dim``; with
    ``root`` the standard deviation instead of the variance.

    float32 runs in float64 and is rounded once, as torch's CPU kernel accumulates: squares of
    deviations near 1.8e19 overflowed float32 (``std`` of a column holding -3.4e38 came back inf,
    torch 1.7e38; issue 32 fuzz)."""
    x = floating(b, x)
    if x.dtype == torch.float32 and b.precision == "f32":
        var, mean = _variance(b, cast(b, x, torch.float64), dim, correction, keepdim, root)
        return cast(b, var, torch.float32), cast(b, mean, torch.float32)
    axes = axes_of(x, dim)
    n = size_product(x, axes)
    if isinstance(n, int):
        mean = binary(b, "div", reduce(b, "sum_reduce", x, axes), float(n))
        divisor: Value | float = float(max(n - correction, 0))
    else:  # a dynamic dim is reduced: the count is read from the tensor at run time
        mean = reduce(b, "mean_reduce", x, axes)
        divisor = binary(b, "max", binary(b, "sub", size_tensor(b, n, x.dtype), float(correction)), 0.0)
    centered = binary(b, "sub", x, mean)
    squares = reduce(b, "sum_reduce", binary(b, "mul", centered, centered), axes)
    var = binary(b, "div", squares, divisor)
    var = unary(b, "sqrt", var) if root else var
    return finish(b, var, axes, keepdim), finish(b, mean, axes, keepdim)


def _correction(unbiased: bool, correction: float | None) -> float:
    return float(correction) if correction is not None else (1.0 if unbiased else 0.0)


@rule("aten::var")
def var_all(b: Builder, x: Value, unbiased: bool = True) -> Value:
    """var(Tensor self, bool unbiased=True) -> Tensor"""
    return _variance(b, x, None, _correction(unbiased, None), False)[0]


@rule("aten::var.dim")
def var_dim(b: Builder, x: Value, dim: Dims, unbiased: bool = True, keepdim: bool = False) -> Value:
    """var.dim(Tensor self, int[1]? dim, bool unbiased=True, bool keepdim=False) -> Tensor"""
    return _variance(b, x, dim, _correction(unbiased, None), keepdim)[0]


@rule("aten::var.correction")
def var_correction(
    b: Builder, x: Value, dim: Dims = None, correction: float | None = None, keepdim: bool = False
) -> Value:
    """var.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False)"""
    return _variance(b, x, dim, _correction(True, correction), keepdim)[0]


@rule("aten::std")
def std_all(b: Builder, x: Value, unbiased: bool = True) -> Value:
    """std(Tensor self, bool unbiased=True) -> Tensor"""
    return _variance(b, x, None, _correction(unbiased, None), False, root=True)[0]


@rule("aten::std.dim")
def std_dim(b: Builder, x: Value, dim: Dims, unbiased: bool = True, keepdim: bool = False) -> Value:
    """std.dim(Tensor self, int[1]? dim, bool unbiased=True, bool keepdim=False) -> Tensor"""
    return _variance(b, x, dim, _correction(unbiased, None), keepdim, root=True)[0]


@rule("aten::std.correction")
def std_correction(
    b: Builder, x: Value, dim: Dims = None, correction: float | None = None, keepdim: bool = False
) -> Value:
    """std.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False)"""
    return _variance(b, x, dim, _correction(True, correction), keepdim, root=True)[0]


@rule("aten::var_mean", "aten::var_mean.correction")
def var_mean(
    b: Builder, x: Value, dim: Dims = None, correction: float | None = None, keepdim: bool = False
) -> tuple[Value, Value]:
    """var_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False)"""
    if isinstance(dim, bool):  # var_mean(Tensor self, bool unbiased=True)
        return _variance(b, x, None, _correction(dim, None), False)
    return _variance(b, x, dim, _correction(True, correction), keepdim)


@rule("aten::std_mean", "aten::std_mean.correction")
def std_mean(
    b: Builder, x: Value, dim: Dims = None, correction: float | None = None, keepdim: bool = False
) -> tuple[Value, Value]:
    """std_mean.correction(Tensor self, int[1]? dim=None, *, Scalar? correction=None, bool keepdim=False)"""
    if isinstance(dim, bool):  # std_mean(Tensor self, bool unbiased=True)
        return _variance(b, x, None, _correction(dim, None), False, root=True)
    return _variance(b, x, dim, _correction(True, correction), keepdim, root=True)


# ---- norms ----------------------------------------------------------------------------------


def vector_norm(
    b: Builder, x: Value, p: float | str, dim: Dims, keepdim: bool, dtype: torch.dtype | None
) -> Value:
    """The p-norm over ``dim``: p = 2/'fro', 1, ±inf, 0 (count of non-zeros) or any other power."""
    x = floating(b, cast(b, x, dtype) if dtype is not None else x)
    axes = axes_of(x, dim)
    p = 2.0 if p == "fro" else p
    if not isinstance(p, (int, float)):
        raise LoweringError(f"norm: p must be a number or 'fro', got {p!r}")
    p = float(p)
    if p == 2.0:
        y = unary(b, "sqrt", reduce(b, "sum_reduce", binary(b, "mul", x, x), axes))
    elif p == 1.0:
        y = reduce(b, "sum_reduce", unary(b, "abs", x), axes)
    elif math.isinf(p):
        y = reduce(b, "max_reduce" if p > 0 else "min_reduce", unary(b, "abs", x), axes)
    elif p == 0.0:
        y = reduce(b, "sum_reduce", cast(b, binary(b, "ne", x, 0.0), x.dtype or torch.float32), axes)
    else:
        powered = reduce(b, "sum_reduce", binary(b, "pow", unary(b, "abs", x), p), axes)
        y = binary(b, "pow", powered, 1.0 / p)
    return finish(b, y, axes, keepdim)


@rule("aten::linalg_vector_norm")
def linalg_vector_norm(
    b: Builder,
    x: Value,
    ord: float = 2,
    dim: Dims = None,
    keepdim: bool = False,
    dtype: torch.dtype | None = None,
) -> Value:
    """linalg_vector_norm(Tensor self, Scalar ord=2, int[1]? dim=None, bool keepdim=False, *, dtype=None)"""
    return vector_norm(b, x, ord, dim, keepdim, dtype)


@rule("aten::norm.Scalar", "aten::norm.ScalarOpt_dtype")
def norm_all(b: Builder, x: Value, p: float | None = 2, dtype: torch.dtype | None = None) -> Value:
    """norm.Scalar(Tensor self, Scalar p=2) -> Tensor"""
    return vector_norm(b, x, 2 if p is None else p, None, False, dtype)


@rule("aten::norm.ScalarOpt_dim", "aten::norm.ScalarOpt_dim_dtype")
def norm_dim(
    b: Builder, x: Value, p: float | None, dim: Dims, keepdim: bool = False, dtype: torch.dtype | None = None
) -> Value:
    """norm.ScalarOpt_dim(Tensor self, Scalar? p, int[1] dim, bool keepdim=False) -> Tensor"""
    return vector_norm(b, x, 2 if p is None else p, dim, keepdim, dtype)


@rule("aten::frobenius_norm.dim")
def frobenius_norm(b: Builder, x: Value, dim: Dims, keepdim: bool = False) -> Value:
    """frobenius_norm.dim(Tensor self, int[1] dim, bool keepdim=False) -> Tensor"""
    return vector_norm(b, x, 2.0, dim, keepdim, None)


@rule("aten::var_mean.dim")
def var_mean_dim(
    b: Builder, x: Value, dim: Dims, unbiased: bool = True, keepdim: bool = False
) -> tuple[Value, Value]:
    """var_mean.dim(Tensor self, int[1]? dim, bool unbiased=True, bool keepdim=False) -> (Tensor, Tensor)"""
    return _variance(b, x, dim, _correction(unbiased, None), keepdim)


@rule("aten::std_mean.dim")
def std_mean_dim(
    b: Builder, x: Value, dim: Dims, unbiased: bool = True, keepdim: bool = False
) -> tuple[Value, Value]:
    """std_mean.dim(Tensor self, int[1]? dim, bool unbiased=True, bool keepdim=False) -> (Tensor, Tensor)"""
    return _variance(b, x, dim, _correction(unbiased, None), keepdim, root=True)

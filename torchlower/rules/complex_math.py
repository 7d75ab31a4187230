"""Arithmetic on complex tensors beyond ``complex_parts.py``'s products and sums: quotients,
negation, powers, ``exp``, sums and means over dims, and complex tensors built from real parts
(``polar``, ``complex``): what complex-mask enhancers (DCCRN / DCUNet) and HDemucs compute.

Results are physical ``[..., 2]`` tensors seen as complex again (``complex_views.back``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchlower.core.values import Value, constant
from torchlower.errors import LoweringError
from torchlower.rules import common, reduce, rule
from torchlower.rules.common import Builder, Operand
from torchlower.rules.complex_parts import (
    COMPLEX_OF,
    angle,
    complex_aware,
    complex_mul,
    complex_override,
    conj_physical,
    is_complex,
    join,
    part,
    physical,
    squared_magnitude,
)
from torchlower.rules.complex_views import back, logical_dim
from torchlower.rules.layout import broadcast_to, dims_of


# ---- arithmetic ----------------------------------------------------------------------------------
@complex_override("neg", "negative", "neg_", "negative_")
def neg(b: Builder, z: Value) -> Value:
    """neg(Tensor self) -> Tensor of a complex tensor."""
    p = physical(z)
    return back(b.call("neg", [p], dtype=p.dtype, shape=p.shape))


def _reciprocal(b: Builder, w: Value) -> Value:
    """1 / w = conj(w) / |w|²."""
    q = physical(w)
    m = squared_magnitude(b, q)
    m = b.call("unsqueeze", [m], {"axes": [m.rank]}, dtype=m.dtype, shape=(*dims_of(m), 1))
    c = conj_physical(b, q)
    return back(b.call("div", [c, m], dtype=q.dtype, shape=q.shape))


@complex_override("div", "true_divide", "divide", "div_", "true_divide_", "divide_")
def div(b: Builder, x: Operand, y: Operand, rounding_mode: str | None = None) -> Value:
    """div.Tensor(Tensor self, Tensor other) -> Tensor with a complex side (no rounding mode)."""
    if rounding_mode is not None:
        raise LoweringError(f"div of complex tensors has no rounding_mode (got {rounding_mode!r})")
    if is_complex(y):
        assert isinstance(y, Value)
        return complex_mul(b, x, _reciprocal(b, y))
    if isinstance(y, Value):
        r = b.call("div", [1.0, y], dtype=y.dtype, shape=y.shape)
        return complex_mul(b, x, r)
    return complex_mul(b, x, 1.0 / float(y))  # type: ignore[arg-type]


@complex_override("pow", "pow_")
def pow_(b: Builder, z: Operand, exponent: Operand) -> Value:
    """pow.Tensor_Scalar(Tensor self, Scalar exponent) -> Tensor of a complex tensor: products
    for small integer exponents, ``|z|^p · e^{i p·angle(z)}`` (the principal value) otherwise."""
    if not is_complex(z) or isinstance(exponent, Value):
        raise LoweringError("pow with a complex exponent or a tensor exponent is not supported")
    assert isinstance(z, Value)
    e = float(exponent)  # type: ignore[arg-type]
    if e == int(e) and 1 <= e <= 4:
        out = z
        for _ in range(int(e) - 1):
            out = complex_mul(b, out, z)
        return out
    p = physical(z)
    magnitude = b.call("pow", [squared_magnitude(b, p), e / 2], dtype=p.dtype, shape=tuple(dims_of(z)))
    return _polar(b, magnitude, b.call("mul", [angle(b, z), e], dtype=p.dtype, shape=magnitude.shape))


@complex_override("exp", "exp_")
def exp(b: Builder, z: Value) -> Value:
    """exp(Tensor self) -> Tensor of a complex tensor: ``e^re · (cos im, sin im)``."""
    p = physical(z)
    magnitude = b.call("exp", [part(b, p, 0)], dtype=p.dtype, shape=tuple(dims_of(z)))
    return _polar(b, magnitude, part(b, p, 1))


@complex_override("sum")
def sum_(
    b: Builder, z: Value, dim: Sequence[int] | None = None, keepdim: bool = False, dtype: Any = None
) -> Value:
    """sum.dim_IntList(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None)"""
    if isinstance(dim, torch.dtype):
        dim = None  # sum(Tensor self, *, ScalarType? dtype=None): complex sums stay complex
    dims = list(range(z.rank)) if not dim else [logical_dim(z, d) for d in dim]
    return back(reduce.sum_(b, physical(z), dims, keepdim, None))


@complex_override("mean")
def mean(
    b: Builder, z: Value, dim: Sequence[int] | None = None, keepdim: bool = False, dtype: Any = None
) -> Value:
    """mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None)"""
    if isinstance(dim, torch.dtype):
        dim = None  # sum(Tensor self, *, ScalarType? dtype=None): complex sums stay complex
    dims = list(range(z.rank)) if not dim else [logical_dim(z, d) for d in dim]
    return back(reduce.mean(b, physical(z), dims, keepdim, None))


# ---- complex from real parts ---------------------------------------------------------------------
def _polar(b: Builder, magnitude: Value, theta: Value) -> Value:
    shp = tuple(dims_of(magnitude))
    re = b.call("mul", [magnitude, b.call("cos", [theta], dtype=theta.dtype, shape=theta.shape)],
                dtype=magnitude.dtype, shape=shp)  # fmt: skip
    im = b.call("mul", [magnitude, b.call("sin", [theta], dtype=theta.dtype, shape=theta.shape)],
                dtype=magnitude.dtype, shape=shp)  # fmt: skip
    return back(join(b, re, im))


def _same_shape(b: Builder, x: Operand, y: Operand) -> tuple[Value, Value]:
    """Two real operands broadcast against each other (``polar`` / ``complex`` broadcast)."""
    xs = x if isinstance(x, Value) else constant(torch.tensor(float(x)))
    ys = y if isinstance(y, Value) else constant(torch.tensor(float(y)))
    target = list(common.broadcast_shapes(dims_of(xs), dims_of(ys)))
    out = []
    for v in (xs, ys):
        if tuple(dims_of(v)) != tuple(target):
            v = broadcast_to(b, v, target, v.dtype)
        out.append(v)
    return out[0], out[1]


def _float_parts(x: Value, what: str) -> None:
    if x.dtype not in COMPLEX_OF:
        raise LoweringError(f"{what}: expects float32 (or float16 / float64) parts, got {x.dtype}")


@rule("aten::polar")
@complex_aware
def polar(b: Builder, magnitude: Value, angle: Value) -> Value:
    """polar(Tensor abs, Tensor angle) -> Tensor: ``abs · (cos angle, sin angle)``."""
    _float_parts(magnitude, "polar")
    m, a = _same_shape(b, magnitude, angle)
    return _polar(b, m, a)


@rule("aten::complex")
@complex_aware
def complex_(b: Builder, real: Value, imag: Value) -> Value:
    """complex(Tensor real, Tensor imag) -> Tensor"""
    _float_parts(real, "complex")
    re, im = _same_shape(b, real, imag)
    return back(join(b, re, im))

"""Pointwise math: powers, exp/log, rounding, integer division, trig, cumulative sums.

PyTorch's type promotion is applied before emitting (``promote``): tract's binary ops need one
dtype, and an integer literal next to an integer tensor becomes a TDim in tract, so non-float
scalars are written as small typed constants instead of literals.
"""

from __future__ import annotations

import functools
import math
import operator

import torch

from torchlower.core.values import Shape, SymDim, Value, constant
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import (
    Builder,
    Operand,
    align_ranks,
    cast,
    rank0,
    rank_of,
    shape_of,
    size_tensor,
    tract_operands,
)

# ---- helpers shared by the compare / reduce_extra families ---------------------------------


def broadcast_shape(*xs: Operand) -> Shape:
    """The broadcast of the operands' shapes (symbolic dims must agree or meet a 1)."""
    rank = max(rank_of(x) for x in xs)
    dims: list[int | str] = [1] * rank
    for x in xs:
        shape = shape_of(x)
        for i, d in enumerate(shape, start=rank - len(shape)):
            if dims[i] == 1:
                dims[i] = d
    return tuple(dims)


def floating(b: Builder, x: Value) -> Value:
    """Float ops on integer/bool tensors compute in torch's default float dtype."""
    return x if x.dtype is not None and x.dtype.is_floating_point else cast(b, x, torch.float32)


def _dummy(x: Operand) -> torch.Tensor | float | int | bool:
    if isinstance(x, SymDim):  # a size promotes like the Python int it stands for
        return 0
    if not isinstance(x, Value):
        return x
    if x.is_const and x.const.dim() == 0:
        return x.const
    return torch.zeros((1,) * x.rank, dtype=x.dtype)


def result_type(*xs: Operand) -> torch.dtype:
    """torch's promoted dtype of the operands (tensors, 0-dim tensors and Python scalars)."""
    acc = functools.reduce(operator.add, [_dummy(x) for x in xs])  # same promotion as result_type
    if not isinstance(acc, torch.Tensor):
        raise LoweringError("expected at least one tensor operand")
    return acc.dtype


def promote(b: Builder, *xs: Operand, dtype: torch.dtype | None = None) -> list[Operand]:
    """Operands cast to one dtype and aligned to one rank, ready for a tract binary op."""
    dtype = dtype or result_type(*xs)
    rank = max(rank_of(x) for x in xs)
    out: list[Operand] = []
    for x in xs:
        if isinstance(x, Value):
            out.append(cast(b, x, dtype))
        elif dtype.is_floating_point:
            out.append(float(x))
        else:  # typed constant: an int literal would be read as a TDim by tract
            out.append(constant(torch.full((1,) * max(rank, 1), x, dtype=dtype)))
    return align_ranks(b, *out)


def binary(b: Builder, op: str, x: Operand, y: Operand, dtype: torch.dtype | None = None) -> Value:
    """``op(x, y)`` after promotion; the result has the promoted dtype unless ``op`` compares."""
    x, y = (size_tensor(b, v) if isinstance(v, SymDim) else v for v in (x, y))  # ``x * T``: a size
    rank = max(rank_of(x), rank_of(y))
    px, py = promote(b, x, y, dtype=dtype)
    out = dtype or result_type(px, py)
    shape = broadcast_shape(px, py)
    if out == torch.bool and op in ("eq", "ne"):  # tract compares numbers only
        differ = b.call("tract_core_xor", [px, py], dtype=torch.bool, shape=shape)
        same = differ if op == "ne" else b.call("not", [differ], dtype=torch.bool, shape=shape)
        return rank0(b, same, rank)
    if op in ("eq", "ne", "lt", "le", "gt", "ge", "and", "or", "tract_core_xor"):
        out = torch.bool
    op, px, py = tract_operands(b, op, px, py)
    result = b.call(op, [px, py], dtype=out, shape=shape)
    if out == torch.bool and _symbolic_broadcast(px, py):
        # tract 0.23.9 derives wrong shapes for select/and over a comparison broadcast on symbolic
        # dims (a causal mask from two ranges); a round trip through f32 hides the pattern
        as_float = b.call("tract_core_cast", [result], {"to": "f32"}, dtype=torch.float32, shape=shape)
        result = b.call("gt", [as_float, 0.5], dtype=torch.bool, shape=shape)
    return rank0(b, result, rank)


def _symbolic_broadcast(*xs: Operand) -> bool:
    shapes = [x.shape for x in xs if isinstance(x, Value) and x.shape is not None]
    symbolic = any(not isinstance(d, int) for s in shapes for d in s)
    return symbolic and any(tuple(s) != tuple(shapes[0]) for s in shapes)


def unary(b: Builder, op: str, x: Value) -> Value:
    return b.call(op, [x], dtype=x.dtype, shape=x.shape)


def select(b: Builder, cond: Value, yes: Operand, no: Operand) -> Value:
    """``where(cond, yes, no)``; ``yes``/``no`` share a dtype (scalars follow the tensor)."""
    tensors = [v for v in (yes, no) if isinstance(v, Value)]
    dtype = result_type(*tensors) if tensors else torch.float32
    yes, no = promote(b, yes, no, dtype=dtype) if tensors else (yes, no)
    cond, yes, no = align_ranks(b, cond, yes, no)
    return b.call("select", [cond, yes, no], dtype=dtype, shape=broadcast_shape(cond, yes, no))


def _float_unary(op: str) -> object:
    def lower(b: Builder, x: Value) -> Value:
        return unary(b, op, floating(b, x))

    return lower


# ---- elementwise unary ----------------------------------------------------------------------

for _aten, _op in {
    "sqrt": "sqrt", "rsqrt": "rsqrt", "exp": "exp", "log": "log", "erf": "tract_core_erf",
    "sin": "sin", "cos": "cos", "tan": "tan", "asin": "asin", "acos": "acos", "atan": "atan",
    "sinh": "sinh", "cosh": "cosh", "asinh": "asinh", "acosh": "acosh", "atanh": "atanh",
    "reciprocal": "recip",
}.items():  # fmt: skip
    _fn = _float_unary(_op)
    _fn.__doc__ = f"{_aten}(Tensor self) -> Tensor"
    _fn.__name__ = _fn.__qualname__ = _aten
    rule(f"aten::{_aten}", f"aten::{_aten}_")(_fn)

for _alias, _target in {"arcsin": "asin", "arccos": "acos", "arctan": "atan", "arcsinh": "asinh",
                        "arccosh": "acosh", "arctanh": "atanh"}.items():  # fmt: skip
    rule(f"aten::{_alias}")(_float_unary(_target))


@rule("aten::abs", "aten::abs_", "aten::absolute")
def abs_(b: Builder, x: Value) -> Value:
    """abs(Tensor self) -> Tensor"""
    return unary(b, "abs", x)


@rule("aten::neg", "aten::neg_", "aten::negative")
def neg(b: Builder, x: Value) -> Value:
    """neg(Tensor self) -> Tensor"""
    return unary(b, "neg", x)


@rule("aten::sign", "aten::sign_", "aten::sgn")
def sign(b: Builder, x: Value) -> Value:
    """sign(Tensor self) -> Tensor

    torch's sign of NaN is 0; tract's is NaN."""
    if x.dtype == torch.bool:
        return x
    if x.dtype is None or not x.dtype.is_floating_point:
        return unary(b, "sign", x)
    nan = b.call("tract_core_is_nan", [x], dtype=torch.bool, shape=x.shape)
    return select(b, nan, 0.0, unary(b, "sign", x))


@rule("aten::log1p", "aten::log1p_")
def log1p(b: Builder, x: Value) -> Value:
    """log1p(Tensor self) -> Tensor

    ``log(1 + x)`` loses the digits of a small ``x`` to the rounding of ``1 + x``; with
    ``u = 1 + x``, ``log(u) · x / (u − 1)`` divides that rounding back out (Goldberg), exact
    to a few ulp. ``u == 1`` gives ``x``. The ratio is within an ulp of 1 wherever it is a
    number; at ``x == inf`` it is inf/inf, and tract's ``min`` (which drops NaN) makes it 2, so
    ``log(inf) · 2`` is inf — one op where a test for inf took three (pointwise chains).
    """
    x = floating(b, x)
    u = binary(b, "add", x, 1.0)
    gap = binary(b, "sub", u, 1.0)
    ratio = binary(b, "min", binary(b, "div", x, gap), 2.0)
    return select(b, binary(b, "eq", gap, 0.0), x, binary(b, "mul", unary(b, "log", u), ratio))


@rule("aten::expm1", "aten::expm1_")
def expm1(b: Builder, x: Value) -> Value:
    """expm1(Tensor self) -> Tensor

    ``exp(x) − 1`` cancels for small ``x``; ``(u − 1) · x / log(u)`` with ``u = exp(x)`` does
    not (Kahan). ``u == 1`` gives ``x``, ``u − 1 == −1`` gives −1 and ``u == inf`` gives inf.
    """
    x = floating(b, x)
    u = unary(b, "exp", x)
    gap = binary(b, "sub", u, 1.0)
    plain = binary(b, "or", binary(b, "eq", gap, -1.0), binary(b, "eq", u, math.inf))
    exact = select(b, plain, 1.0, binary(b, "div", x, unary(b, "log", u)))
    scaled = binary(b, "mul", gap, exact)
    return select(b, binary(b, "eq", u, 1.0), x, scaled)


@rule("aten::log2")
def log2(b: Builder, x: Value) -> Value:
    """log2(Tensor self) -> Tensor"""
    return binary(b, "mul", unary(b, "log", floating(b, x)), 1.0 / math.log(2.0))


@rule("aten::log10")
def log10(b: Builder, x: Value) -> Value:
    """log10(Tensor self) -> Tensor"""
    return binary(b, "mul", unary(b, "log", floating(b, x)), 1.0 / math.log(10.0))


@rule("aten::square")
def square(b: Builder, x: Value) -> Value:
    """square(Tensor self) -> Tensor"""
    if _integral(x):
        return _int_power(b, x, 2, torch.int64 if x.dtype == torch.bool else x.dtype)  # type: ignore[arg-type]
    return binary(b, "mul", x, x)


# ---- rounding -------------------------------------------------------------------------------


def _integral(x: Value) -> bool:
    return x.dtype is not None and not x.dtype.is_floating_point


@rule("aten::floor", "aten::floor_")
def floor(b: Builder, x: Value) -> Value:
    """floor(Tensor self) -> Tensor"""
    return x if _integral(x) else unary(b, "floor", x)


@rule("aten::ceil", "aten::ceil_")
def ceil(b: Builder, x: Value) -> Value:
    """ceil(Tensor self) -> Tensor"""
    return x if _integral(x) else unary(b, "ceil", x)


@rule("aten::trunc", "aten::trunc_", "aten::fix")
def trunc(b: Builder, x: Value) -> Value:
    """trunc(Tensor self) -> Tensor"""
    if _integral(x):
        return x
    return select(b, binary(b, "lt", x, 0.0), unary(b, "ceil", x), unary(b, "floor", x))


@rule("aten::round", "aten::round_")
def round_(b: Builder, x: Value, decimals: int = 0) -> Value:
    """round(Tensor self) -> Tensor / round.decimals(Tensor self, *, int decimals) -> Tensor

    Ties go to even like torch (``tract_core_round_even``); decimals scale by 10**d first."""
    if _integral(x):
        return x
    if decimals == 0:
        return unary(b, "tract_core_round_even", x)
    scale = 10.0**decimals
    scaled = binary(b, "mul", x, scale) if decimals > 0 else binary(b, "div", x, 10.0**-decimals)
    rounded = unary(b, "tract_core_round_even", scaled)
    return binary(b, "div", rounded, scale) if decimals > 0 else binary(b, "mul", rounded, 10.0**-decimals)


# ---- binary ---------------------------------------------------------------------------------


@rule("aten::pow", "aten::pow_", "aten::float_power")
def pow_(b: Builder, x: Operand, exponent: Operand) -> Value:
    """pow.Tensor_Tensor(Tensor self, Tensor exponent) -> Tensor (also .Tensor_Scalar, .Scalar)"""
    dtype = result_type(x, exponent)
    if not dtype.is_floating_point:
        if isinstance(exponent, int) and 0 <= exponent <= 64 and isinstance(x, Value):
            return _int_power(b, x, exponent, dtype)
        raise LoweringError(f"pow: integer tensors need a constant exponent in [0, 64], got {exponent!r}")
    if isinstance(exponent, (int, float)) and float(exponent) == 2.0 and isinstance(x, Value):
        return binary(b, "mul", x, x, dtype=dtype)
    if isinstance(exponent, (int, float)) and float(exponent) == -0.5 and isinstance(x, Value):
        return unary(b, "rsqrt", floating(b, x))  # torch's own special case: pow(-0., -0.5) is -inf
    # torch's other special cases, bit for bit; tract's PowConst took 1.6 µs per element on
    # GPT-2's gelu (x³), 95 % of the model's time
    if isinstance(exponent, (int, float)) and float(exponent) == 3.0 and isinstance(x, Value):
        return binary(b, "mul", binary(b, "mul", x, x, dtype=dtype), x, dtype=dtype)
    if isinstance(exponent, (int, float)) and float(exponent) == 0.5 and isinstance(x, Value):
        return unary(b, "sqrt", floating(b, x))  # sqrt(-0.) is -0., as torch
    return binary(b, "pow", x, exponent, dtype=dtype)  # powf is exact for integral exponents < 0 bases


def _int_power(b: Builder, x: Value, n: int, dtype: torch.dtype) -> Value:
    """Integer powers by repeated products, in f64 (tract has no integer square; exact < 2**53)."""
    base = cast(b, x, torch.float64)
    result: Value | None = None
    while n:
        if n & 1:
            result = base if result is None else binary(b, "mul", result, base)
        n >>= 1
        if n:
            base = binary(b, "mul", base, base)
    if result is None:
        result = binary(b, "add", binary(b, "mul", base, 0.0), 1.0)
    return cast(b, result, dtype)


@rule("aten::fmin")
def fmin(b: Builder, x: Value, y: Value) -> Value:
    """fmin(Tensor self, Tensor other) -> Tensor (NaN ignored, like tract's min)"""
    return binary(b, "min", x, y)


@rule("aten::fmax")
def fmax(b: Builder, x: Value, y: Value) -> Value:
    """fmax(Tensor self, Tensor other) -> Tensor (NaN ignored, like tract's max)"""
    return binary(b, "max", x, y)


def _nan_propagating(b: Builder, op: str, x: Value, y: Value) -> Value:
    out = binary(b, op, x, y)
    if not out.dtype.is_floating_point:
        return out
    for v in (y, x):  # NaN != NaN: a NaN operand is the result
        if isinstance(v, Value):
            v = cast(b, v, out.dtype)
            out = select(b, binary(b, "ne", v, v), v, out)
    return out


@rule("aten::minimum")
def minimum(b: Builder, x: Value, y: Value) -> Value:
    """minimum(Tensor self, Tensor other) -> Tensor (NaN propagates; tract's min drops it)"""
    return _nan_propagating(b, "min", x, y)


@rule("aten::maximum")
def maximum(b: Builder, x: Value, y: Value) -> Value:
    """maximum(Tensor self, Tensor other) -> Tensor (NaN propagates; tract's max drops it)"""
    return _nan_propagating(b, "max", x, y)


@rule("aten::atan2", "aten::atan2_", "aten::arctan2")
def atan2(b: Builder, y: Value, x: Value) -> Value:
    """atan2(Tensor self, Tensor other) -> Tensor: atan(y/x) moved to the right quadrant."""
    dtype = torch.promote_types(result_type(y, x), torch.float32)
    y, x = promote(b, y, x, dtype=dtype)
    # x = 0 gives ±inf → ±pi/2. tract divides as y · recip(x), and recip of a float32 denormal
    # overflows to inf (0 / -1e-45 was NaN, torch -0): the quotient is taken in float64
    wide = [cast(b, v, torch.float64) if dtype == torch.float32 else v for v in (y, x)]
    base = unary(b, "atan", cast(b, binary(b, "div", *wide), dtype))
    # y = -0.0 turns by -pi like y < 0 (torch: atan2(-0., -1.) = -pi); only 1 / y tells -0 from +0
    below = binary(b, "or", binary(b, "lt", y, 0.0), binary(b, "lt", unary(b, "recip", y), 0.0))
    turn = select(b, below, -math.pi, math.pi)
    # base + 0.0 would turn a -0.0 (atan2(-0., denormal)) into +0: the turn is selected instead
    shifted = select(b, binary(b, "lt", x, 0.0), binary(b, "add", base, turn), base)
    origin = binary(b, "and", binary(b, "eq", x, 0.0), binary(b, "eq", y, 0.0))
    # at the origin the zeros' signs decide: x = -0 gives ±pi (by y's sign), x = +0 gives y (±0)
    at_origin = select(b, binary(b, "lt", unary(b, "recip", x), 0.0), turn, y)
    return select(b, origin, at_origin, shifted)

"""Division family: floor division, fmod and remainder with torch's rounding, exactly.

tract divides floats as ``x * recip(y)``, which is not correctly rounded: ``x / |x|`` can come
out as 0.99999994 and its floor as 0 (measured in 0.23.9). Rounded divisions therefore work in
float64 and check the candidate with its remainder ``x - q·y`` (exact in float64 for float32
operands while ``|q| < 2**24``), moving ``q`` by one where the remainder shows it is off.
"""

from __future__ import annotations

import math

import torch

from torchlower.core.values import Value, constant
from torchlower.rules import rule
from torchlower.rules.common import (
    Builder,
    Operand,
    align_ranks,
    broadcast_shapes,
    cast,
    rank0,
    rank_of,
    tract_operands,
)
from torchlower.rules.math import binary, result_type, select, trunc, unary

_EXACT_BELOW = float(2**24)  # |q| from here on: float32 quotients are integers already


def rounded_quotient(b: Builder, x: Operand, y: Operand, dtype: torch.dtype, mode: str) -> Value:
    """``floor`` or ``trunc`` of ``x / y`` for float ``dtype``, in ``dtype``."""
    wide = torch.float64 if dtype in (torch.float32, torch.float16, torch.bfloat16) else dtype
    xw, yw = (_widened(b, v, wide) for v in (x, y))
    xw, yw = align_ranks(b, xw, yw)
    shape = broadcast_shapes(*[v.shape for v in (xw, yw) if isinstance(v, Value) and v.shape is not None])

    def num(op: str, *args: Operand) -> Value:
        return b.call(op, list(args), dtype=wide, shape=shape)

    def test(op: str, *args: Operand) -> Value:
        return b.call(op, list(args), dtype=torch.bool, shape=shape)

    def pick(cond: Value, yes: Value, no: Value) -> Value:
        return num("select", cond, yes, no)

    def infinite(v: Operand) -> Value | bool:  # on the float32 operand: an f32 inf constant fits
        if not isinstance(v, Value):
            return math.isinf(v)
        v = cast(b, v, dtype)
        return b.call(
            "eq",
            [b.call("abs", [v], dtype=v.dtype, shape=v.shape), math.inf],
            dtype=torch.bool,
            shape=v.shape,
        )

    op, a, c = tract_operands(b, "div", xw, yw)
    q = num("floor", num(op, a, c))
    r = num("sub", xw, num("mul", q, yw))
    y_negative = test("lt", yw, 0.0) if isinstance(yw, Value) else bool(yw < 0)
    checked = test("lt", num("abs", q), _EXACT_BELOW)
    r_negative = test("lt", r, 0.0)
    if isinstance(y_negative, Value):  # tract compares numbers only: booleans differ by xor
        opposite = test("tract_core_xor", r_negative, y_negative)
    else:
        opposite = test("not", r_negative) if y_negative else r_negative
    size = num("abs", yw) if isinstance(yw, Value) else abs(yw)
    too_big = test("and", test("and", test("ne", r, 0.0), opposite), checked)
    too_small = test("and", test("ge", num("abs", r), size), checked)
    q = pick(too_big, num("sub", q, 1.0), pick(too_small, num("add", q, 1.0), q))
    if mode == "trunc":  # a negative inexact quotient rounds up
        r = num("sub", xw, num("mul", q, yw))
        inexact = test("and", test("ne", r, 0.0), test("lt", q, 0.0))
        q = pick(inexact, num("add", q, 1.0), q)
    elif isinstance(xw, Value):  # torch's floor division goes through fmod: inf // y is NaN,
        x_inf, y_inf = infinite(x), infinite(y)
        if isinstance(y_inf, Value):  # and -1 // inf is -1 (q is ±0 there)
            signs = test("lt", num("mul", xw, yw), 0.0)
            minus_one = num("sub", num("mul", q, 0.0), 1.0)
            q = pick(test("and", _ranked(b, y_inf, q), signs), minus_one, q)
        nan = num("sub", xw, xw)  # inf - inf (``inf // 0`` is inf: x / y is taken first)
        if isinstance(yw, Value):
            q = pick(test("and", _ranked(b, x_inf, q), test("ne", yw, 0.0)), nan, q)
        elif yw != 0:
            q = pick(_ranked(b, x_inf, q), nan, q)
    return cast(b, q, dtype)


def _widened(b: Builder, v: Operand, wide: torch.dtype) -> Operand:
    """``v`` in ``wide``: a plain float stays a literal; -0.0, inf and NaN (which the builder
    writes as float32 tensors) and constants become ``[1]``-shaped ``wide`` constants."""
    if isinstance(v, Value) and not (v.is_const and v.const.dim() == 0):
        return cast(b, v, wide)
    number = float(v.const.item()) if isinstance(v, Value) else float(v)
    if math.isfinite(number) and not (number == 0 and math.copysign(1.0, number) < 0):
        return number
    return constant(torch.tensor([number], dtype=wide))


def _ranked(b: Builder, cond: Value, like: Value) -> Value:
    """``cond`` (from an operand) unsqueezed to the rank of the broadcast result ``like``."""
    return align_ranks(b, cond, like)[0]


def _trunc_div(b: Builder, x: Operand, y: Operand, dtype: torch.dtype) -> Value:
    q = binary(b, "div", x, y, dtype=dtype)
    return q if not dtype.is_floating_point else trunc(b, q)


@rule("aten::fmod", "aten::fmod_")
def fmod(b: Builder, x: Operand, y: Operand) -> Value:
    """fmod.Tensor(Tensor self, Tensor other) -> Tensor (C semantics: sign of the dividend)"""
    dtype = result_type(x, y)
    if dtype != torch.float32:
        r = binary(b, "sub", x, binary(b, "mul", _trunc_div(b, x, y, dtype), y, dtype=dtype), dtype=dtype)
        return _zero_signed_like(b, r, x) if dtype.is_floating_point else r
    # torch's fmod is exact; x / y rounded in f32 can land on the next integer (fmod(-0.5, 0.1) gave
    # ~0 instead of -0.1): in f64 the quotient of two f32 values keeps its fractional part and
    # q * y is exact, so the remainder is right before rounding back to f32
    x64, y64 = (cast(b, v, torch.float64) if isinstance(v, Value) else v for v in (x, y))
    qy = binary(b, "mul", _trunc_div(b, x64, y64, torch.float64), y64, dtype=torch.float64)
    r = binary(b, "sub", x64, qy, dtype=torch.float64)
    return _zero_signed_like(b, cast(b, r, torch.float32), x)


def _zero_signed_like(b: Builder, r: Value, x: Operand) -> Value:
    """A zero remainder carries the dividend's sign, as in C and torch (``1 / fmod(-2., 1.)`` is -inf):
    ``x * 0`` (written ``x * (x - x)`` so tract does not fold it) where ``r`` is 0."""
    if isinstance(x, Value) and x.is_const and x.const.numel() == 1:
        x = x.const.item()  # a wrapped scalar: its sign is known now
    if not isinstance(x, Value) and x >= 0:
        return r  # x - q * y is +0 when it is zero
    # tract reads a `-0.0` literal as +0: for a negative scalar dividend flip the (+0) zero of r
    signed_zero = (
        binary(b, "mul", x, 0.0, dtype=r.dtype) if isinstance(x, Value) else binary(b, "mul", r, -1.0)
    )
    return select(b, binary(b, "eq", r, 0.0, dtype=r.dtype), signed_zero, r)


@rule("aten::remainder", "aten::remainder_")
def remainder(b: Builder, x: Operand, y: Operand) -> Value:
    """remainder.Tensor(Tensor self, Tensor other) -> Tensor (Python semantics: sign of the divisor)"""
    dtype = result_type(x, y)
    if dtype.is_floating_point:  # x - floor(x / y) * y; a zero result keeps the dividend's sign
        wide = torch.float64 if dtype == torch.float32 else dtype  # exact quotient, as in fmod
        xw, yw = (cast(b, v, wide) if isinstance(v, Value) else v for v in (x, y))
        q = unary(b, "floor", binary(b, "div", xw, yw, dtype=wide))
        r = binary(b, "sub", xw, binary(b, "mul", q, yw, dtype=wide), dtype=wide)
        return _zero_signed_like(b, cast(b, r, dtype), x)
    r = fmod(b, x, y)
    wrong_sign = binary(b, "ne", binary(b, "lt", r, 0, dtype=dtype), binary(b, "lt", y, 0, dtype=dtype))
    fix = binary(b, "and", binary(b, "ne", r, 0, dtype=dtype), wrong_sign)
    out = binary(b, "add", r, select(b, fix, y if isinstance(y, Value) else _typed(y, dtype), 0))
    return rank0(b, out, max(rank_of(x), rank_of(y)))


def _typed(v: float | int | bool, dtype: torch.dtype) -> Value:
    return constant(torch.tensor([v], dtype=dtype))


@rule("aten::floor_divide", "aten::floor_divide_")
def floor_divide(b: Builder, x: Operand, y: Operand) -> Value:
    """floor_divide(Tensor self, Tensor other) -> Tensor"""
    dtype = result_type(x, y)
    if dtype.is_floating_point:
        return rank0(b, rounded_quotient(b, x, y, dtype, "floor"), max(rank_of(x), rank_of(y)))
    q = binary(b, "div", x, y, dtype=dtype)  # tract truncates integer division
    inexact = binary(b, "ne", binary(b, "mul", q, y, dtype=dtype), x, dtype=dtype)
    negative = binary(b, "ne", binary(b, "lt", x, 0, dtype=dtype), binary(b, "lt", y, 0, dtype=dtype))
    out = binary(b, "sub", q, select(b, binary(b, "and", inexact, negative), _typed(1, dtype), 0))
    return rank0(b, out, max(rank_of(x), rank_of(y)))

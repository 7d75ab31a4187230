"""Division family: floor division, fmod and remainder with torch's rounding, exactly.

tract divides floats as ``x * recip(y)``, which is not correctly rounded: ``x / |x|`` can come
out as 0.99999994 and its floor as 0 (measured in 0.23.9). Rounded divisions therefore work in
float64 and check the candidate with its remainder ``x - q·y`` (exact in float64 for float32
operands while ``|q| < 2**29``), moving ``q`` by one where the remainder shows it is off.
fmod and remainder take ``x - q·y`` with that quotient: from ``x * recip(y)`` alone a remainder of
an exact multiple came out as ``x`` instead of 0 (``fmod(x, x)``, measured in 0.23.9).
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
from torchlower.rules.math import binary, result_type, select, trunc

_NARROW = (torch.float32, torch.float16, torch.bfloat16)


def rounded_quotient(b: Builder, x: Operand, y: Operand, dtype: torch.dtype, mode: str) -> Value:
    """``floor`` or ``trunc`` of ``x / y`` for float ``dtype``, in ``dtype``."""
    return cast(b, wide_quotient(b, x, y, dtype, mode)[0], dtype)


def wide_quotient(
    b: Builder, x: Operand, y: Operand, dtype: torch.dtype, mode: str
) -> tuple[Value, Operand, Operand]:
    """``floor`` or ``trunc`` of ``x / y`` in float64 (for float ``dtype``), with the widened operands."""
    wide = torch.float64 if dtype in _NARROW else dtype
    # q·y is exact in float64 while q has at most 53 - 24 bits: float32 operands are checked up to 2**29
    exact_below = float(2**29) if dtype in _NARROW else float(2**24)
    xw, yw = (_widened(b, v, wide) for v in (x, y))
    xw, yw = align_ranks(b, xw, yw)
    shape = broadcast_shapes(*[v.shape for v in (xw, yw) if isinstance(v, Value) and v.shape is not None])

    def num(op: str, *args: Operand) -> Value:
        return b.call(op, list(args), dtype=wide, shape=shape)

    def test(op: str, *args: Operand) -> Value:
        return b.call(op, list(args), dtype=torch.bool, shape=shape)

    def pick(cond: Value, yes: Value, no: Value) -> Value:
        return num("select", cond, yes, no)

    op, a, c = tract_operands(b, "div", xw, yw)
    d = num(op, a, c)
    q = num("floor", d)
    r = num("sub", xw, num("mul", q, yw))
    y_negative = _test(b, "lt", yw, 0.0, shape)
    checked = test("lt", num("abs", q), exact_below)
    opposite = _differ(b, test("lt", r, 0.0), y_negative, shape)
    size = _magnitude(b, yw, wide, shape)
    too_big = test("and", test("and", test("ne", r, 0.0), opposite), checked)
    too_small = test("and", test("ge", num("abs", r), size), checked)
    q = pick(too_big, num("sub", q, 1.0), pick(too_small, num("add", q, 1.0), q))
    if mode == "trunc":  # a negative inexact quotient rounds up
        r = num("sub", xw, num("mul", q, yw))
        inexact = test("and", test("ne", r, 0.0), test("lt", q, 0.0))
        q = pick(inexact, num("add", q, 1.0), q)
    # |x| < |y| (y = ±inf included): the quotient is ±0, or -1 when floored with opposite signs.
    # x - q·y is not exact there (|x| ≪ |y|) and must not move q: -7.5 // 1e30 rounded to 0
    small = _test(b, "lt", _magnitude(b, xw, wide, shape), size, shape)
    zero = num("mul", d, num("sub", d, d))  # ±0 with the quotient's sign, as torch's
    if mode == "floor":
        signs = _differ(b, _test(b, "lt", xw, 0.0, shape), y_negative, shape)
        below = _test(b, "and", signs, _test(b, "ne", xw, 0.0, shape), shape)
        if below is not False:
            zero = num("sub", zero, 1.0) if below is True else pick(below, num("sub", zero, 1.0), zero)
    q = pick(small, zero, q)
    if mode == "floor" and isinstance(xw, Value):  # torch's floor division goes through fmod: inf // y
        nan = num("sub", xw, xw)  # is NaN (``inf // 0`` is inf: x / y is taken first)
        x_inf = _ranked(b, _infinite(b, x, dtype), q)
        q = pick(_test(b, "and", x_inf, _test(b, "ne", yw, 0.0, shape), shape), nan, q)
    return q, xw, yw


def _test(b: Builder, op: str, u: Operand, v: Operand, shape: object) -> Value | bool:
    """A comparison or logical op; on two plain numbers it is folded here."""
    if not isinstance(u, Value) and not isinstance(v, Value):
        folded = {"lt": u < v, "ne": u != v, "and": bool(u) and bool(v)}
        return folded[op]
    if not isinstance(u, Value) and op == "and":
        return v if u else False
    if not isinstance(v, Value) and op == "and":
        return u if v else False
    return b.call(op, [u, v], dtype=torch.bool, shape=shape)


def _differ(b: Builder, u: Value | bool, v: Value | bool, shape: object) -> Value | bool:
    """u xor v (tract compares numbers only: booleans differ by ``tract_core_xor``)."""
    if isinstance(u, Value) and isinstance(v, Value):
        return b.call("tract_core_xor", [u, v], dtype=torch.bool, shape=shape)
    if isinstance(u, Value) or isinstance(v, Value):
        live, fixed = (u, v) if isinstance(u, Value) else (v, u)
        return b.call("not", [live], dtype=torch.bool, shape=shape) if fixed else live
    return u != v


def _magnitude(b: Builder, v: Operand, wide: torch.dtype, shape: object) -> Operand:
    return b.call("abs", [v], dtype=wide, shape=v.shape) if isinstance(v, Value) else abs(v)


def _infinite(b: Builder, v: Operand, dtype: torch.dtype) -> Value | bool:
    """|v| == inf, on the narrow operand (an f32 inf constant fits)."""
    if not isinstance(v, Value):
        return math.isinf(v)
    v = cast(b, v, dtype)
    return b.call(
        "eq", [b.call("abs", [v], dtype=v.dtype, shape=v.shape), math.inf], dtype=torch.bool, shape=v.shape
    )


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


def _float_remainder(b: Builder, x: Operand, y: Operand, dtype: torch.dtype, mode: str) -> Value:
    """``x - q·y`` in float64 with the exact rounded quotient ``q``; where ``|x| < |y|`` and ``q``
    is 0 that is ``x`` itself (also for ``|y| = inf``, where ``0 · inf`` would make it NaN)."""
    q, xw, yw = wide_quotient(b, x, y, dtype, mode)
    r = binary(b, "sub", xw, binary(b, "mul", q, yw, dtype=q.dtype), dtype=q.dtype)
    small = _test(b, "lt", _magnitude(b, xw, q.dtype, q.shape), _magnitude(b, yw, q.dtype, q.shape), q.shape)
    keep = _test(b, "and", small, binary(b, "eq", q, 0.0, dtype=q.dtype), q.shape)
    return select(b, keep, xw if isinstance(xw, Value) else constant(torch.tensor([xw], dtype=q.dtype)), r)


@rule("aten::fmod", "aten::fmod_")
def fmod(b: Builder, x: Operand, y: Operand) -> Value:
    """fmod.Tensor(Tensor self, Tensor other) -> Tensor (C semantics: sign of the dividend)"""
    dtype = result_type(x, y)
    if not dtype.is_floating_point:
        return binary(b, "sub", x, binary(b, "mul", _trunc_div(b, x, y, dtype), y, dtype=dtype), dtype=dtype)
    r = cast(b, _float_remainder(b, x, y, dtype, "trunc"), dtype)
    return rank0(b, _zero_signed_like(b, r, x), max(rank_of(x), rank_of(y)))


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
        r = cast(b, _float_remainder(b, x, y, dtype, "floor"), dtype)
        return rank0(b, _zero_signed_like(b, r, x), max(rank_of(x), rank_of(y)))
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

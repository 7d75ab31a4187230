"""NaN and ±inf kept where tract's max / min family drops them (issue 32), float operands only.

Measured in tract 0.23.9 on one-op graphs (``tract`` Python package):

- ``relu(NaN)`` is 0 and ``relu(-0.0)`` is +0 (torch NaN, -0); binary ``max`` / ``min`` with a
  scalar return the scalar for a NaN (so ``clamp(NaN, -1, 1)`` is -1, ``hardtanh``, ``relu6``,
  ``hardsigmoid`` alike; torch NaN);
- ``argmax_reduce`` / ``argmin_reduce`` skip NaN (``argmax([NaN, 1, 3])`` is 2; torch returns
  the first NaN's index, 0);
(``max_pool``'s NaN and ``-inf`` windows are a graph guard, ``nnef/guards_values.py: nan_pools``,
which can see whether its input can hold them at all.)

Integer and bool operands keep tract's plain op: they hold no NaN, and the integer paths pay
nothing. Each helper costs a few elementwise ops per call (docs/reliability.md gives the
measured cost on a ResNet-18).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from torchlower.core.values import Value, constant
from torchlower.rules.common import Builder, cast
from torchlower.rules.math import binary, select, unary


def is_float(x: object) -> bool:
    return isinstance(x, Value) and x.dtype is not None and x.dtype.is_floating_point


def isnan(b: Builder, x: Value) -> Value:
    return b.call("tract_core_is_nan", [x], dtype=torch.bool, shape=x.shape)


def kept(b: Builder, x: object, y: Value) -> Value:
    """``y`` with ``x``'s NaN where ``x`` is NaN (a float tensor ``x``; otherwise ``y``)."""
    if not is_float(x) or not is_float(y):
        return y
    assert isinstance(x, Value)
    return select(b, isnan(b, cast(b, x, y.dtype)), cast(b, x, y.dtype), y)


def bounded(b: Builder, x: Value, lo: float | None, hi: float | None) -> Value:
    """torch's ``clamp`` of a float tensor by scalar bounds, as its kernel computes it:
    ``x < lo ? lo : x``, then ``y > hi ? hi : y``. A NaN fails both tests and passes through,
    ``-0.0`` stays ``-0.0`` against a bound 0 (tract's ``max`` / ``relu`` give the bound, +0)."""
    y = x
    if lo is not None:
        y = select(b, _compare(b, "lt", y, abs(lo) if lo == 0 else lo), _bound(b, x, lo), y)
    first = y
    if hi is not None:
        y = select(b, _compare(b, "gt", y, abs(hi) if hi == 0 else hi), _bound(b, x, hi), y)
    b.clamps[y.name] = (x, lo, hi, first)  # guards_values.fused_clamps may make it tract's max / min again
    return y


def _compare(b: Builder, op: str, x: Value, bound: float) -> Value:
    """The test, named aside: the clamp's result takes the node's name (the same archive bytes
    as tract's plain form where ``fused_clamps`` gives that back)."""
    hint, b.hint = b.hint, f"{b.hint}_{op}"
    try:
        return binary(b, op, x, bound)
    finally:
        b.hint = hint


def _bound(b: Builder, x: Value, bound: float) -> Value | float:
    """The value a clamp selects. A ``-0.0`` bound is computed from ``x``: tract merges equal
    constants and ``-0.0 == 0.0``, so a ``-0.0`` constant and any ``0.0`` literal of the graph
    become one (both +0 or both -0; docs/reliability.md). ``-|s - s|`` with ``s = sign(x)`` is
    -0.0 wherever x is not NaN (inf included), and a NaN x never selects the bound."""
    if bound != 0 or math.copysign(1.0, bound) > 0:
        return _operand(b, x, bound)
    s = unary(b, "sign", x)
    return unary(b, "neg", unary(b, "abs", binary(b, "sub", s, s)))


def _operand(b: Builder, x: Value, bound: float) -> Value | float:
    """A literal, or in an f16 export a typed constant (tract's select takes no f32 literal
    beside an f16 tensor)."""
    if b.precision != "f16":
        return bound
    hint, b.hint = b.hint, f"{b.hint}_bound"
    try:
        return b.tensor(constant(torch.full([1] * x.rank, bound, dtype=x.dtype)))
    finally:
        b.hint = hint


def relu(b: Builder, x: Value) -> Value:
    """``clamp(x, min=0)``: NaN and -0.0 pass through as in torch."""
    return bounded(b, x, 0.0, None)


def argext(b: Builder, plain: Value, x: Value, axis: int, keep: Callable[[Value], Value]) -> Value:
    """``plain`` (tract's argmax / argmin of ``x`` along ``axis``, shaped by ``keep``) replaced by
    the first NaN's index in rows that hold one."""
    nan = cast(b, isnan(b, x), torch.float32)
    shape = list(x.shape or ())
    shape[axis] = 1
    first = b.call("argmax_reduce", [nan], {"axes": [axis]}, dtype=torch.int64, shape=tuple(shape))
    count = b.call("sum_reduce", [nan], {"axes": [axis]}, dtype=torch.float32, shape=tuple(shape))
    has = binary(b, "gt", count, 0.0)
    return select(b, keep(has), keep(first), plain)

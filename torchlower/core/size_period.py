"""The exact least value of a one-symbol size expression built from floors of affine terms.

``1 + floor((T + 240)/320) - 2·floor((T + 560)/640)`` (a pad that makes an encoder's length even
again) is 0 or 1, but bounding each floor apart gives -1. Such an expression is a slope times T
plus a part periodic in T with the least common multiple of the floors' denominators as period;
with a slope >= 0 its least value over T >= lo is the least over the first period, which is
evaluated exactly (at most ``_MAX_PERIOD`` sizes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

_MAX_PERIOD = 1 << 16


def periodic_least(e: Any, lows: Mapping[str, int]) -> Any:
    """The least value of ``e`` over its one symbol at or above its lower bound, or None."""
    import sympy

    symbols = list(e.free_symbols)
    if len(symbols) != 1 or not e.has(sympy.floor):
        return None
    t = symbols[0]
    period = 1
    for f in e.atoms(sympy.floor):
        inner = sympy.expand(f.args[0])
        if inner.has(sympy.floor) or not inner.is_polynomial(t) or sympy.degree(inner, t) != 1:
            return None
        slope = sympy.Rational(inner.coeff(t, 1))
        offset = inner.coeff(t, 0)
        if not offset.is_Rational:
            return None
        period = math.lcm(period, int(slope.q), int(sympy.Rational(offset).q))
    linear = sympy.expand(e.replace(lambda x: isinstance(x, sympy.floor), lambda x: x.args[0]))
    if not linear.is_polynomial(t) or sympy.degree(linear, t) > 1 or linear.coeff(t, 1) < 0:
        return None
    if period > _MAX_PERIOD:
        return None
    lo = int(lows.get(t.name, 1))
    at = sympy.lambdify(t, e, modules=[{"floor": _floor}, "math"])
    return sympy.Integer(min(int(at(sympy.Integer(v))) for v in range(lo, lo + period)))


def _floor(x: Any) -> int:
    return int(x.__floor__()) if hasattr(x, "__floor__") else math.floor(x)

"""Integer arithmetic on symbolic sizes: ``S * 2``, ``B * S``, ``S // 2`` stay expressions.

Front ends meet sizes as scalars (``aten::size`` then ``aten::mul`` in a jit graph, SymInt
arithmetic under torch.export); folding them to the example's numbers would bake the size, so
every op here is applied to ``SymDim``s instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchlower.core.values import SymDim, Value


def _floordiv(a: Any, b: Any) -> Any:
    return a // b


def _extremum(kind: str) -> Any:
    """``torch.sym_max`` / ``sym_min`` of sizes (``max(0, table - S)`` in MPT's ALiBi slice)."""

    def fn(a: Any, b: Any) -> Any:
        import sympy

        pick = sympy.Max if kind == "max" else sympy.Min
        return SymDim.wrap(pick(SymDim._e(a), SymDim._e(b)))

    return fn


_SCALAR_OPS = {
    "add": lambda a, b, alpha=1: a + b * alpha,
    "sub": lambda a, b, alpha=1: a - b * alpha,
    "rsub": lambda a, b, alpha=1: b - a * alpha,
    "mul": lambda a, b: a * b,
    "floordiv": _floordiv,
    "floor_divide": _floordiv,
    "div": lambda a, b, rounding_mode=None: _floordiv(a, b) if rounding_mode == "floor" else _exact_div(a, b),
    "neg": lambda a: -1 * a,
    "Int": lambda a: a,
    "ScalarImplicit": lambda a: a,
    "sym_int": lambda a: a,
    "clone": lambda a, memory_format=None: a,
    "detach": lambda a: a,
    "remainder": lambda a, b: a - _floordiv(a, b) * b,
    "__floordiv__": _floordiv,
    "sym_max": _extremum("max"),
    "sym_min": _extremum("min"),
}


_IDENTITY = {"Int", "ScalarImplicit", "sym_int", "clone", "detach"}


def _exact_div(a: Any, b: Any) -> Any:
    if isinstance(b, SymDim) or (isinstance(b, int) and b != 0):
        q = a // b
        if q * b == a:
            return q
    raise TypeError("not an exact division")


def scalar_op(name: str, args: Sequence[Any]) -> Any:
    """Sizes combined by integer ops stay symbolic: ``S * 2``, ``B * S``, ``S // 2``.

    Returns ``NotImplemented`` unless a SymDim takes part and every argument is a size
    (int, SymDim, a rank-0 integer constant, or a tensor known to hold a size: ``size_value``).
    """
    if name not in _IDENTITY:  # a copy of a tensor holding a size stays that tensor
        args = [a.size_value if isinstance(a, Value) and a.size_value is not None else a for a in args]
    fn = _SCALAR_OPS.get(name)
    if fn is None or not any(isinstance(a, SymDim) for a in args):
        return NotImplemented
    plain = []
    for a in args:
        if isinstance(a, Value):
            if a.const is None or a.const.dim() != 0 or a.const.is_floating_point():
                return NotImplemented
            a = int(a.const.item())
        elif isinstance(a, (float, list, tuple)):
            return NotImplemented
        plain.append(a)
    while plain and plain[-1] is None:
        plain.pop()
    try:
        return fn(*plain)
    except TypeError:
        return NotImplemented

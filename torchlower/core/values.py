"""Symbolic values: what flows from a front end through the rules into a builder.

A value is a graph identifier plus what rules need to know about it: dtype and shape
(dims are ints, or symbol names such as ``"B"`` for dynamic axes) and, for constants,
the concrete tensor so rules and front ends can fold instead of emitting ops.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Union

from torchlower.core import size_floors
from torchlower.core.size_period import periodic_least

if TYPE_CHECKING:
    import torch


class SymDim:
    """A dynamic size: an integer expression over named symbols (``B``, ``B*S``, ``S + 1``).

    Backed by sympy so arithmetic simplifies (``(B*S)/S`` is ``B``); printed in tract's TDim
    syntax, which tract accepts wherever an NNEF attribute or operand takes a size.
    """

    __slots__ = ("expr",)

    def __init__(self, expr: object) -> None:
        import sympy

        self.expr = (
            sympy.sympify(expr)
            if not isinstance(expr, str)
            else sympy.Symbol(expr, integer=True, positive=True)
        )

    @staticmethod
    def wrap(expr: object) -> int | SymDim:
        """An int when the expression is a constant, else a SymDim."""
        import sympy

        expr = sympy.sympify(expr)
        if expr.has(sympy.Min, sympy.Max):
            expr = expr.replace(lambda e: isinstance(e, (sympy.Min, sympy.Max)), _decided)
        return int(expr) if expr.is_Integer else SymDim(expr)

    @staticmethod
    def _e(other: object) -> object:
        return other.expr if isinstance(other, SymDim) else other

    def __add__(self, o: object) -> int | SymDim:
        return SymDim.wrap(self.expr + self._e(o))

    __radd__ = __add__

    def __sub__(self, o: object) -> int | SymDim:
        return SymDim.wrap(self.expr - self._e(o))

    def __rsub__(self, o: object) -> int | SymDim:
        return SymDim.wrap(self._e(o) - self.expr)

    def __mul__(self, o: object) -> int | SymDim:
        return SymDim.wrap(self.expr * self._e(o))

    __rmul__ = __mul__

    def __floordiv__(self, o: object) -> int | SymDim:
        import sympy

        return SymDim.wrap(sympy.floor(self.expr / self._e(o)))

    def __rfloordiv__(self, o: object) -> int | SymDim:
        import sympy

        return SymDim.wrap(sympy.floor(self._e(o) / self.expr))

    def __eq__(self, o: object) -> bool:
        return bool(self.expr == self._e(o))

    def __hash__(self) -> int:
        return hash(self.expr)

    def __repr__(self) -> str:
        return f"SymDim({self})"

    def __str__(self) -> str:
        return tdim_text(self.expr)

    @property
    def symbol(self) -> str | None:
        """The symbol's name when the expression is a bare symbol (``T``), else None."""
        return str(self.expr) if self.expr.is_Symbol else None

    @property
    def symbols(self) -> list[str]:
        return sorted(str(s) for s in self.expr.free_symbols)


def tdim_text(expr: object) -> str:
    """tract TDim text of a sympy integer expression (+, -, *, integer division)."""
    import sympy

    if expr.is_Integer or expr.is_Symbol:
        return str(expr)
    if type(expr).__name__ == "FloorDiv":  # torch.export's own integer division (torch.utils._sympy)
        return f"({tdim_text(expr.args[0])} / {tdim_text(expr.args[1])})"
    if isinstance(expr, sympy.floor):
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        negative = at_least(-num)
        if den.is_Integer and den > 0 and negative is not None and negative >= 0:
            # tract's TDim division truncates toward zero: floor(-m / d) is -((m + d - 1) / d)
            return f"-1 * ({tdim_text(sympy.expand(-num + den - 1))} / {tdim_text(den)})"
        return f"({tdim_text(num)} / {tdim_text(den)})"
    if expr.is_Add:
        terms = sorted(expr.args, key=sympy.default_sort_key)
        return "(" + " + ".join(tdim_text(t) for t in terms) + ")"
    if expr.is_Mul:
        factors = sorted(expr.args, key=sympy.default_sort_key)
        return " * ".join(tdim_text(f) for f in factors)
    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) > 1:  # S**2: tract multiplies symbols
        return " * ".join([tdim_text(expr.base)] * int(expr.exp))
    if type(expr).__name__ in ("Min", "Max"):  # sympy's, or torch.export's own classes of that name
        # tract's TDim has min(..) and max(..)
        args = sorted(expr.args, key=sympy.default_sort_key)
        return f"{type(expr).__name__.lower()}({', '.join(tdim_text(a) for a in args)})"
    raise ValueError(f"size expression {expr} has no tract TDim form")


Dim = Union[int, SymDim]
Shape = tuple[Dim, ...]


@dataclass(frozen=True, eq=False)
class Value:
    """A tensor in the graph being built (identity matters, so ``eq`` is by object)."""

    name: str
    dtype: torch.dtype | None = None
    shape: Shape | None = None
    const: torch.Tensor | None = field(default=None, repr=False)
    label: str | None = None  # weight path for constants that came from the model
    # an integer tensor of rank 0 or 1 whose elements are sizes known at export time:
    # ``(start, step)``, element i is ``start + i * step`` (an ``arange`` over sizes, or one of
    # its elements), so an element taken back into a size (``arange(P, P + S)[0] + S``) stays
    # the expression ``P + S`` instead of a run-time tensor tract cannot size a tensor with
    series: tuple[Dim, Dim] | None = None

    @property
    def rank(self) -> int:
        if self.shape is None:
            raise ValueError(f"value {self.name} has no known shape")
        return len(self.shape)

    @property
    def is_const(self) -> bool:
        return self.const is not None

    @property
    def is_symbolic(self) -> bool:
        """Some size is a symbol (dynamic axes): known, but not an int."""
        return self.shape is not None and any(not isinstance(d, int) for d in self.shape)

    def static_shape(self) -> tuple[int, ...]:
        """The shape as ints; raises when a dim is symbolic (callers that need sizes baked)."""
        if self.shape is None or self.is_symbolic:
            raise ValueError(f"value {self.name} has a non-static shape {self.shape}")
        return tuple(int(d) for d in self.shape)  # type: ignore[arg-type]

    @property
    def size_value(self) -> Dim | None:
        """The size a rank-0 integer tensor is known to hold (see ``series``), else None."""
        return self.series[0] if self.series is not None and self.shape == () else None

    def with_meta(self, dtype: torch.dtype | None, shape: Shape | None) -> Value:
        """Same value, with dtype/shape known from the front end (trace or export meta).

        A size counted at run time (``nonzero``'s, a symbol named ``COUNTED…``) stays the rule's:
        the front end saw the example's count, which another input does not have."""
        if shape is not None and self.shape is not None and len(shape) == len(self.shape):
            shape = tuple(d if counted(d) else o for d, o in zip(self.shape, shape, strict=True))
        return replace(
            self,
            dtype=dtype if dtype is not None else self.dtype,
            shape=shape if shape is not None else self.shape,
        )


COUNTED = "nonzero"  # prefix of the symbols of sizes counted at run time (rules/masks.py)


def counted(d: object) -> bool:
    """A size that depends on tensor values (a ``nonzero`` count), not on the inputs' shapes."""
    return isinstance(d, SymDim) and any(s.startswith(COUNTED) for s in d.symbols)


def constant(tensor: torch.Tensor, label: str | None = None, name: str = "") -> Value:
    """A value known at export time."""
    return Value(
        name=name or (label or "const"),
        dtype=tensor.dtype,
        shape=tuple(tensor.shape),
        const=tensor,
        label=label,
    )


def normalize_dim(dim: int, rank: int) -> int:
    """Map a possibly negative ``dim`` into ``[0, rank)``."""
    if not -rank <= dim < max(rank, 1):
        raise IndexError(f"dim {dim} out of range for rank {rank}")
    return dim % rank if rank else 0


class Missing:
    """Stands for the result of an op without a rule, so lowering goes on to find the others."""

    def __repr__(self) -> str:
        return "<missing>"


MISSING = Missing()


def _decided(e: Any) -> Any:
    """``min(1, 2*floor((T + 7) / 8))`` → ``1``: a min/max whose arguments' order holds for every
    positive symbol, by interval arithmetic (sympy cannot order floors; tract 0.23 then fails to
    equate such sizes, e.g. a relative-position slice ``[:, 1:]`` of a length that is ≥ 1).
    Failing that, over the sizes the model runs at (``size_floors``: the bound is then adopted)."""
    chosen = _ordered(e, None)
    floors = size_floors.current()
    if chosen is not None or floors is None:
        return e if chosen is None else chosen
    lows = {s.name: floors.of(s.name) for s in e.free_symbols}
    lows = {name: low for name, low in lows.items() if low is not None and low > 1}
    chosen = _ordered(e, lows) if lows else None
    if chosen is None:
        return e
    for name in lows:
        floors.used.setdefault(name, str(e))
    return chosen


def _ordered(e: Any, lows: Mapping[str, int] | None) -> Any:
    """The argument of min/max ``e`` every other one is >= to (<= for max), else None."""
    sign = 1 if type(e).__name__ == "Min" else -1
    for a in e.args:
        bounds = [at_least(sign * (b - a), lows) for b in e.args if b is not a]
        if all(low is not None and low >= 0 for low in bounds):
            return a
    return None


def at_least(e: Any, lows: Mapping[str, int] | None = None) -> Any:
    """A lower bound of the size expression ``e`` over positive integer symbols (None: unknown),
    or over symbols at least ``lows[name]``.

    Term by term first (``2*floor((T + 7) / 8) - 1 >= 1``); then with each floor replaced by a
    bound of it, ``c·floor(x) >= c·x`` for c < 0 and ``>= c·(x - (d - 1) / d)`` for c > 0 (d the
    denominator of x), so terms can cancel (``-T - 4*floor(-T / 4) >= 0``, padding to a multiple
    of 4). The larger of the two bounds; when that is negative, the exact least value of a
    one-symbol expression periodic in it (``size_period``).
    """
    import sympy

    e = sympy.sympify(e)
    low = _at_least(e, lows or {})
    if not e.has(sympy.floor):
        return low
    bounded = sympy.expand(e).replace(
        lambda t: isinstance(t, sympy.Mul) and any(isinstance(f, sympy.floor) for f in t.args),
        _floor_bound,
    )
    lows_ = [x for x in (low, _at_least(sympy.expand(bounded), lows or {})) if x is not None]
    if not lows_ or max(lows_) < 0:  # floors that cancel only together: exact over one period
        lows_ += [x for x in (periodic_least(e, lows or {}),) if x is not None]
    return max(lows_) if lows_ else None


def _floor_bound(term: Any) -> Any:
    import sympy

    c = sympy.Mul(*[f for f in term.args if f.is_Number])
    rest = [f for f in term.args if not f.is_Number]
    if len(rest) != 1 or not isinstance(rest[0], sympy.floor):
        return term
    x = rest[0].args[0]
    if c < 0:
        return c * x
    num, den = sympy.fraction(sympy.together(x))
    gap = (den - 1) / den if den.is_Integer and den > 0 and num.is_integer else 1  # floor(n/d) >= (n-d+1)/d
    return c * (x - gap)


def _at_least(e: Any, lows: Mapping[str, int]) -> Any:
    import sympy

    if e.is_Number:
        return e
    if e.is_Symbol:
        return sympy.Integer(lows.get(e.name, 1)) if e.is_positive else None
    if isinstance(e, sympy.Add):
        parts = [_at_least(t, lows) for t in e.args]
        return None if any(x is None for x in parts) else sympy.Add(*parts)
    if isinstance(e, sympy.Mul):
        consts = [t for t in e.args if t.is_Number]
        rest = [t for t in e.args if not t.is_Number]
        c = sympy.Mul(*consts)
        if c < 0:
            return None
        parts = [_at_least(t, lows) for t in rest]
        if any(x is None or x < 0 for x in parts):
            return None
        return c * sympy.Mul(*parts)
    if isinstance(e, sympy.floor):
        low = _at_least(e.args[0], lows)
        return None if low is None else sympy.floor(low)
    if isinstance(e, (sympy.Min, sympy.Max)):
        parts = [_at_least(t, lows) for t in e.args]
        if isinstance(e, sympy.Max):
            known = [x for x in parts if x is not None]
            return max(known) if known else None
        return None if any(x is None for x in parts) else min(parts)
    return None

"""Axis sizes that must be multiples: ``k*h + c`` over a symbol ``h``.

A U-Net runs only where H is a multiple of its total stride; declaring ``H = 32*h`` (torch.export's
derived dim ``32*Dim("h")``, ``dynamic_axes`` ``"32*h"``) makes ``h`` the symbol: the capture moves
``h``, the archive's input is shaped ``32 * h`` (tract solves ``h`` from the input), and every
size inside the graph is an expression in ``h`` (``16 * h`` after a stride-2 conv).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from torchlower.core.values import Dim, SymDim

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_FORM = re.compile(
    rf"\s*(?:(?P<k1>\d+)\s*\*\s*)?(?P<s>{_NAME})(?:\s*\*\s*(?P<k2>\d+))?(?:\s*(?P<op>[+-])\s*(?P<c>\d+))?\s*\Z"
)
SPELLING = "a symbol 'h', or a multiple '32*h' / '32*h + 1' (k*symbol + c, k >= 1)"


@dataclass(frozen=True)
class Form:
    """An axis of size ``k*symbol + c``; ``k == 1, c == 0`` is a plain symbol. ``label`` is the
    name the axis had before a multiple was adopted (``H`` for ``H = 32*_H``), for messages."""

    symbol: str
    k: int = 1
    c: int = 0
    label: str | None = None

    @property
    def plain(self) -> bool:
        return self.k == 1 and self.c == 0

    def size(self, value: int) -> int:
        """The axis size when the symbol is ``value``."""
        return self.k * value + self.c

    def value(self, size: int) -> int | None:
        """The symbol's value at an axis ``size``, None when the size is not of this form."""
        rest = size - self.c
        return rest // self.k if rest % self.k == 0 else None

    def dim(self) -> Dim:
        return SymDim(self.symbol) * self.k + self.c if not self.plain else SymDim(self.symbol)

    def text(self) -> str:
        """``32*h``, ``32*h + 1``, ``4*h - 1``: the spelling users write (and notes print)."""
        head = self.symbol if self.k == 1 else f"{self.k}*{self.symbol}"
        return head if self.c == 0 else f"{head} {'+' if self.c > 0 else '-'} {abs(self.c)}"

    def rule(self) -> str:
        """``a multiple of 32``, ``3 more than a multiple of 4``: what sizes this form allows."""
        if self.c == 0:
            return f"a multiple of {self.k}"
        return f"{abs(self.c)} {'more' if self.c > 0 else 'less'} than a multiple of {self.k}"

    def root_bounds(self, lo: int, hi: int | None) -> tuple[int, int | None]:
        """Bounds of the axis size as bounds of the symbol (ceil / floor; at least 1)."""
        low = max(1, -((self.c - lo) // self.k))
        return low, None if hi is None else (hi - self.c) // self.k

    def compose(self, inner: Form) -> Form:
        """This form with its symbol itself ``inner`` (``16*h`` with ``h = 2*g``: ``32*g``)."""
        return Form(inner.symbol, self.k * inner.k, self.k * inner.c + self.c, self.label or inner.label)


def parse_form(text: Any) -> Form | None:
    """``"32*h"``, ``"h*32"``, ``"32*h + 1"``, ``"h"`` as a ``Form``; None for anything else."""
    if not isinstance(text, str):
        return None
    m = _FORM.match(text)
    if m is None or (m["k1"] and m["k2"]):
        return None
    k = int(m["k1"] or m["k2"] or 1)
    c = int(m["c"] or 0) * (-1 if m["op"] == "-" else 1)
    return Form(m["s"], k, c) if k >= 1 else None


def adopted(symbol: str, k: int, example: int) -> Form:
    """``symbol`` adopted as ``k*_symbol + c`` with the example's offset ``c`` in ``[0, k)`` (or
    ``c - k`` when that leaves the example's value below 1): ``H = 32*_H``, ``H = 4*_H + 3``."""
    c = example % k
    if example - c < k:
        c -= k
    return Form(f"_{symbol}", k, c, label=symbol)


def derived(dim: Any) -> Form | None:
    """torch.export's derived dim (``32*Dim("h") + 1``) as a ``Form``; None for plain Dims or
    anything that is not ``k*root + c``."""
    root, fn = getattr(dim, "root", None), getattr(dim, "fn", None)
    name = getattr(root, "__name__", None)
    if not callable(fn) or not isinstance(name, str):
        return None
    try:
        c, k = int(fn(0)), int(fn(1)) - int(fn(0))
        linear = int(fn(2)) == 2 * k + c and int(fn(7)) == 7 * k + c
    except Exception:
        return None
    return Form(name, k, c) if linear and k >= 1 else None


def linear(dim: Any) -> Form | None:
    """A size ``16*h`` or ``8*h + 4`` (a ``SymDim`` in one symbol) as a ``Form``, else None."""
    import sympy

    expr = getattr(dim, "expr", None)
    if expr is None or len(expr.free_symbols) != 1:
        return None
    (symbol,) = expr.free_symbols
    try:
        poly = sympy.Poly(expr, symbol)
    except sympy.PolynomialError:
        return None
    coeffs = poly.all_coeffs()
    if poly.degree() != 1 or not all(c.is_Integer for c in coeffs) or coeffs[0] < 1:
        return None
    return Form(str(symbol), int(coeffs[0]), int(coeffs[1]))

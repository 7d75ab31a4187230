"""The forms a dynamic size is fitted to, searched in integer arithmetic.

A size is a ``Size``: an evaluator over symbol values (ints or int64 arrays, so a candidate
runs over thousands of probe sizes at once) and its expression, built with sympy once, for the
fit that is kept (sympy's ``subs`` inside the search made a CSPDarknet's fitting take 80 s).
Sizes of one symbol that are ``floor((a·S + r) / c) + d`` keep that form (``quasi``), so a
chain of strided convolutions composes into one division (``(T + 80) / 320``) instead of
seven nested ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from torchlower.core.values import Dim, SymDim

MAX_DIVISOR = 1024  # floor((u + r) / c): strides, STFT hops, patch sizes
MAX_FORMS = 4096  # candidates kept per size; more means the captures hardly constrain it

Quasi = tuple[str, int, int, int, int]  # (symbol, a, c, r, d): floor((a·symbol + r) / c) + d
Form = tuple[int, int, int, int]  # (a, c, r, d) applied to a feature size u


class Size:
    """A size as a function of the symbols: ``fn`` evaluates it, ``expr`` is built once."""

    __slots__ = ("_build", "_expr", "_memo", "fn", "quasi")

    def __init__(
        self, fn: Callable[[Mapping[str, Any]], Any], build: Callable[[], Dim], quasi: Quasi | None = None
    ):
        self.fn, self._build, self.quasi = fn, build, quasi
        self._expr: Dim | None = None
        self._memo: tuple[int, np.ndarray] | None = None

    @property
    def expr(self) -> Dim:
        if self._expr is None:
            self._expr = self._build()
        return self._expr

    def at(self, probes: Mapping[str, np.ndarray]) -> np.ndarray:
        """Values at every probe point (memoized for the fitter's one probe set)."""
        if self._memo is None or self._memo[0] != id(probes):
            n = len(next(iter(probes.values())))
            self._memo = (id(probes), np.broadcast_to(np.asarray(self.fn(probes), dtype=np.int64), (n,)))
        return self._memo[1]

    def of(self, p: Mapping[str, Any]) -> Any:
        """``fn(p)``, from the memo when ``p`` is the probe set (a chain is evaluated once)."""
        return self._memo[1] if self._memo is not None and self._memo[0] == id(p) else self.fn(p)


def _sym(s: str) -> Any:
    import sympy

    return sympy.Symbol(s, integer=True, positive=True)


def symbol(s: str) -> Size:
    return Size(lambda p: p[s], lambda: SymDim(s), (s, 1, 1, 0, 0))


def constant(v: int) -> Size:
    return Size(lambda p: v, lambda: int(v))


def normal(q: Quasi) -> Quasi:
    """The one spelling of ``floor((a·s + r) / c) + d``: a and c coprime, 0 <= r < c."""
    s, a, c, r, d = q
    g = math.gcd(a, c)
    a, c, r = a // g, c // g, r // g  # a·s is a multiple of g: floor((a·s + r)/c) keeps floor(r/g)
    if c == 1:
        return (s, a, 1, 0, d + r)
    return (s, a, c, r % c, d + r // c)


def window_form(kernel: int, stride: int, padding: int, dilation: int = 1) -> Form:
    """A sliding window's output length from its input length u (convolution, pooling without
    ``ceil_mode``, ``unfold``): ``floor((u + 2·padding - dilation·(kernel - 1) - 1) / stride) + 1``."""
    _, a, c, r, d = normal(("", 1, stride, 2 * padding - dilation * (kernel - 1) - 1, 1))
    return (a, c, r, d)


def quasi_size(q: Quasi) -> Size:
    s, a, c, r, d = q

    def build() -> Dim:
        import sympy

        x = _sym(s)
        return SymDim.wrap(sympy.floor((a * x + r) / c) + d if c > 1 else a * x + d)

    return Size(lambda p: (a * p[s] + r) // c + d, build, q)


def floor_of(u: Size, form: Form) -> Size:
    """``floor((a·u + r) / c) + d``; nested divisions of one symbol collapse
    (``floor((floor(x / c1) + k) / c2) = floor((x + k·c1) / (c1·c2))``)."""
    a, c, r, d = form
    if form == (1, 1, 0, 0):
        return u
    if u.quasi is not None:
        s, a1, c1, r1, d1 = u.quasi
        if c1 == 1:
            return quasi_size(normal((s, a * a1, c, a * d1 + r, d)))
        if a == 1:
            return quasi_size(normal((s, a1, c1 * c, r1 + (d1 + r) * c1, d)))

    def build() -> Dim:
        import sympy

        e = u.expr.expr if isinstance(u.expr, SymDim) else u.expr
        return SymDim.wrap(sympy.floor((a * e + r) / c) + d if c > 1 else a * e + d)

    return Size(lambda p: (a * u.of(p) + r) // c + d, build)


def product(sizes: Sequence[Size]) -> Size:
    def fn(p: Mapping[str, Any]) -> Any:
        out = 1
        for s in sizes:
            out = out * s.of(p)
        return out

    def build() -> Dim:
        out: Any = 1
        for s in sizes:
            out = out * s.expr
        return out

    return Size(fn, build)


def extremum(s: str, kind: str, c: int) -> Size:
    """``min(s, c)`` or ``max(s - c, 1)`` (``x[:, -3:]``, a slice past a size)."""

    def build() -> Dim:
        import sympy

        x = _sym(s)
        return SymDim.wrap(sympy.Min(x, c) if kind == "min" else sympy.Max(x - c, 1))

    if kind == "min":
        return Size(lambda p: np.minimum(p[s], c), build)
    return Size(lambda p: np.maximum(p[s] - c, 1), build)


def combination(columns: Sequence[Size], coefs: Sequence[int]) -> Size:
    """``Σ coef · column`` (zero coefficients dropped)."""
    terms = [(int(k), col) for k, col in zip(coefs, columns, strict=True) if k]

    def fn(p: Mapping[str, Any]) -> Any:
        return sum(k * col.of(p) for k, col in terms)

    def build() -> Dim:
        out: Any = 0
        for k, col in terms:
            out = out + k * col.expr
        return SymDim.wrap(out.expr) if isinstance(out, SymDim) else int(out)

    return Size(fn, build)


def floor_forms(u: np.ndarray, m: np.ndarray) -> tuple[list[Form], int]:
    """Every ``(a, c, r, d)`` with ``floor((a·u + r) / c) + d == m`` at each observation, in the
    class ``a·u + d`` (c = 1) or ``floor((u + r) / c) + d`` with ``2 <= c <= MAX_DIVISOR`` and
    ``0 <= r < c`` (strides, windows, ceil divisions; no op a rule lowers scales by a fraction),
    where distinct forms are distinct functions of u. A floor must take three values or more
    over the observations. Simplest first, with the work done."""
    forms: list[Form] = []
    i, j = int(np.argmin(u)), int(np.argmax(u))
    du, dm = int(u[j] - u[i]), int(m[j] - m[i])
    if du == 0:
        return forms, 0
    if dm % du == 0 and dm:
        a, d = dm // du, int(m[i]) - dm // du * int(u[i])
        if np.array_equal(a * u + d, m):
            forms.append((a, 1, 0, d))
    order = np.argsort(u, kind="stable")
    us, ms = u[order], m[order]
    steps_u, steps_m = np.diff(us), np.diff(ms)
    if dm <= 1 or (steps_m < 0).any() or (steps_m[steps_u == 0] != 0).any():
        return forms, len(u)  # a floor never decreases; two values are a step (a clamp), not a division
    # the extreme pair bounds the divisor: dm - 1 <= du / c < dm + 1
    lo, hi = max(2, du // (dm + 1) + 1), min(MAX_DIVISOR, du // (dm - 1))
    if lo > hi:
        return forms, len(u)
    cs = np.arange(lo, hi + 1, dtype=np.int64)
    work = 0
    for shift in (0, 1):  # floor((u0 + r) / c) is one of two values as r runs over [0, c)
        t0 = us[0] // cs + shift
        t = (ms - ms[0])[None, :] + t0[:, None]  # what floor((u_i + r) / c) must be
        r_lo = np.maximum((t * cs[:, None] - us[None, :]).max(axis=1), 0)
        r_hi = np.minimum(((t + 1) * cs[:, None] - us[None, :] - 1).min(axis=1), cs - 1)
        work += t.size
        for k in np.nonzero(r_lo <= r_hi)[0]:
            d = int(ms[0] - t0[k])
            forms += [(1, int(cs[k]), r, d) for r in range(int(r_lo[k]), int(r_hi[k]) + 1)]
            if len(forms) > MAX_FORMS:
                return forms, work
    forms.sort(key=lambda f: (f[1], f[2]))
    return forms, work


MAX_SCALE = 64  # e in e·floor((u + r) / c) + d: padding to a multiple, 2·L - 1 relative positions
Scaled = tuple[Form, int, int]  # (form, e, d0): e·form(u) + d0


def scaled_forms(u: np.ndarray, m: np.ndarray) -> tuple[list[Scaled], int]:
    """Every ``e·floor((u + r) / c) + d`` (``2 <= e <= MAX_SCALE``, c >= 2) equal to ``m`` at each
    observation: ``F.pad`` to a multiple of e (``e·ceil(u / e)``), relative-position tables of
    ``2·L - 1`` rows. e divides every difference of m; the floor is searched as in
    ``floor_forms`` on ``(m - d0) / e``."""
    g = int(np.gcd.reduce(np.abs(m - m[0]))) if len(m) > 1 else 0
    found: list[Scaled] = []
    work = 0
    for e in range(2, min(g, MAX_SCALE) + 1):
        if g % e:
            continue
        d0 = int(m[0] % e)
        got, spent = floor_forms(u, (m - d0) // e)
        work += spent
        found += [(f, e, d0) for f in got if f[1] > 1]  # c = 1 is linear: floor_forms has it already
    return found, work


def scaled_size(u: Size, scaled: Scaled) -> Size:
    """``e·floor((a·u + r) / c) + d`` as a size (``scaled_forms``)."""
    (a, c, r, d), e, d0 = scaled
    inner = floor_of(u, (a, c, r, d))

    def build() -> Dim:
        e_inner = inner.expr.expr if isinstance(inner.expr, SymDim) else inner.expr
        return SymDim.wrap(e * e_inner + d0)

    return Size(lambda p: e * inner.of(p) + d0, build)


def solve(columns: Sequence[np.ndarray], m: np.ndarray) -> list[int] | None:
    """Integer coefficients reproducing ``m`` exactly, if the columns determine them uniquely."""
    rows = np.stack([np.broadcast_to(c, m.shape) for c in columns], axis=1)
    if np.linalg.matrix_rank(rows.astype(float)) < len(columns):
        return None
    coef, *_ = np.linalg.lstsq(rows.astype(float), m.astype(float), rcond=None)
    ints = np.round(coef).astype(np.int64)
    if not np.allclose(coef, ints, atol=1e-6) or not np.array_equal(rows @ ints, m):
        return None
    return [int(k) for k in ints]

"""Sizes seen at several captures, fitted to expressions that hold at every size.

A front end that captures the model at several size points (jit traces, FX runs) sees each
size as one integer per point. A size is fitted as a function of the sizes of its op's inputs
(a convolution's output length from its input length, ``floor((u + r) / c) + d`` with c its
stride), and through them of the symbols; a chain of strided ops composes exactly instead of
guessing a divisor of 320 from a few sampled lengths. The candidates (``size_forms``) form a
bounded class in which distinct forms are distinct functions; a fit is used only when every
candidate consistent with the captures gives the same size at every probe point (each symbol
within ``PROBE_REACH`` of its example size, one at a time and all together). Otherwise the
fitter names probe points that tell the candidates apart; the front end captures the model
there (at most ``MAX_EXTRA`` more captures) and fits again. What is still undecided, or has no
expression, is a ``DynamicAxisError`` naming the size and the sizes it was seen at.

Searching is integer arithmetic, once per distinct observed size (and input sizes): linear in
the graph, and bounded by a work budget that fails with a typed error instead of hanging.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from torchlower.core import size_forms as forms
from torchlower.core import size_probes as probes
from torchlower.core.dynamic import UNFIT, Spec, not_dynamic, same_value
from torchlower.core.size_forms import Size
from torchlower.core.values import Dim, SymDim
from torchlower.errors import DynamicAxisError, LoweringError

PROBE_REACH = 1024  # probe sizes: each symbol within this distance of its example size
MAX_EXTRA = 12  # captures added to tell candidates apart, per export
PER_ROUND = 4
WORK_BUDGET = 300_000_000  # elements compared while searching; far above any real model's need
SPLIT_ROWS = 128  # candidates per undecided size used to choose probe points
PENDING = object()  # a constant whose fit waits for more captures
Hint = tuple[Sequence[int], forms.Form]  # an input size (one value per point) and the op's form on it
_NOFIT = object()


@dataclass(eq=False)
class Pending:
    """A size the captures do not decide yet: its candidates and their values at the probes."""

    what: str
    values: tuple[int, ...]
    candidates: list[Size]  # the first two, for the message
    rows: np.ndarray  # (candidates, probes), at most SPLIT_ROWS of them
    count: int


class SizeFitter:
    """Fits sizes over ``points`` (the spec's, then extra ones); one pass per set of captures."""

    def __init__(self, spec: Spec, frontend: str, budget: int = WORK_BUDGET) -> None:
        self.spec, self.frontend, self.budget = spec, frontend, budget
        self.points: list[dict[str, int]] = [dict(p) for p in spec.points]
        self.failed: list[dict[str, int]] = []
        self.extra = 0
        self.work = 0
        self.probes, self.cost = probes.grid(spec, PROBE_REACH)
        self.begin()

    def begin(self) -> None:
        """Start a pass over the graph (after captures were added: every tuple is longer)."""
        self.known: dict[tuple[int, ...], Size] = {}
        self.cache: dict[Any, Any] = {}
        self.pending: list[Pending] = []
        self.blocked: list[tuple[tuple[int, ...], str]] = []
        for s in self.spec.base:
            self.known[tuple(p[s] for p in self.points)] = forms.symbol(s)
        for by_axis in self.spec.forms.values():  # inputs declared as multiples: 32*h + c
            for f in by_axis.values():
                if not f.plain:
                    seen = tuple(f.size(p[f.symbol]) for p in self.points)
                    term = forms.combination([forms.constant(1), forms.symbol(f.symbol)], [f.c, f.k])
                    self.known.setdefault(seen, term)
        self.columns = {s: np.array([p[s] for p in self.points], dtype=np.int64) for s in self.spec.base}

    # ---- what front ends call -----------------------------------------------------------
    def size(
        self,
        values: Sequence[int],
        inputs: Sequence[Sequence[int]] = (),
        what: str = "",
        hint: Hint | None = None,
    ) -> Dim | None:
        """The proven expression of a size seen as ``values`` (one per point); ``inputs`` are the
        sizes of its op's inputs at the same points; ``hint`` the op's own rule for it (an input
        size and the form applied to it: a convolution's stride and padding), used where it
        reproduces every observation. None: undecided in this pass."""
        m = tuple(int(v) for v in values)
        if all(v == m[0] for v in m):
            return m[0]
        got = self._fit(m, inputs, what, (tuple(int(v) for v in hint[0]), hint[1]) if hint else None)
        if got is _NOFIT:
            raise self._nofit(m, what)
        return None if got is None else got.expr

    def shape(
        self,
        shapes: Sequence[Sequence[int]],
        inputs: Sequence[Sequence[int]],
        what: str,
        hints: Mapping[int, Hint] | None = None,
    ) -> tuple[Dim | None, ...]:
        """Each dim of a result seen with ``shapes`` (one per point); ``hints`` by dim."""
        if any(len(s) != len(shapes[0]) for s in shapes):
            raise self._nofit(tuple(len(s) for s in shapes), f"{what} (its rank)")
        return tuple(
            self.size([int(s[d]) for s in shapes], inputs, f"{what} (dim {d})", (hints or {}).get(d))
            for d in range(len(shapes[0]))
        )

    def value(self, values: Sequence[Any], what: str) -> Any:
        """A constant captured at every point: equal → itself; ints / int lists → fitted;
        ``UNFIT`` when no expression gives it, ``PENDING`` when undecided."""
        first = values[0]
        if all(same_value(v, first) for v in values):
            return first
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            got = self._fit(tuple(values), (), what)
            return UNFIT if got is _NOFIT else PENDING if got is None else got.expr
        if all(isinstance(v, (list, tuple)) and len(v) == len(first) for v in values):
            items = [self.value([v[i] for v in values], what) for i in range(len(first))]
            if any(x is UNFIT for x in items):
                return UNFIT
            return PENDING if any(x is PENDING for x in items) else type(first)(items)
        return UNFIT

    def complete(self) -> bool:
        """True when the pass fitted every size; raises when a size depends on one that failed."""
        if self.pending:
            return False
        if self.blocked:
            raise self._nofit(*self.blocked[0])
        return True

    def wanted(self) -> list[dict[str, int]]:
        """Probe points that split the undecided sizes' candidates most (nearest the example
        first); empty when the extra-capture budget is spent or no probe tells them apart."""
        room = min(PER_ROUND, MAX_EXTRA - self.extra)
        if not self.pending or room <= 0:
            return []
        taken = {tuple(sorted(p.items())) for p in self.points + self.failed}
        rows = [p.rows for p in self.pending]
        self._spend(room * sum(r.size for r in rows))
        points = probes.choose(self.probes, self.cost, rows, taken, room)
        if any(set(_names(p.candidates[0])) != set(_names(p.candidates[1])) for p in self.pending):
            points += probes.mirrored(self.spec, points, taken, room - len(points))
        return points

    def add(self, point: Mapping[str, int], captured: bool) -> None:
        """Record an extra capture (or that the model could not be captured there)."""
        self.extra += 1
        (self.points if captured else self.failed).append(dict(point))

    def unresolved(self) -> DynamicAxisError:
        p = self.pending[0]
        alts = [str(c.expr) for c in p.candidates[:2]]
        more = p.count - 2
        return not_dynamic(
            self.spec,
            self._symbols(p.values),
            f"the size {p.what} is not decided by the captures: {alts[0]} and {alts[1]}"
            f"{f' (and {more} more expressions of that form)' if more > 0 else ''} all give the sizes seen"
            f" ({self._seen(p.values)}), and {self.extra} extra captures did not tell them apart",
        )

    # ---- fitting ------------------------------------------------------------------------
    def _fit(
        self, m: tuple[int, ...], inputs: Sequence[Sequence[int]], what: str, hint: Hint | None = None
    ) -> Any:
        feats: list[tuple[int, ...]] = []
        blocked = False
        for f in inputs:
            f = tuple(int(v) for v in f)
            if all(v == f[0] for v in f) or f in feats:
                continue
            if f in self.known:
                feats.append(f)
            else:
                blocked = True  # an input size still undecided in this pass
        if blocked:  # an input size is undecided in this pass: this one waits for the next
            self.blocked.append((m, what))
            return None
        key = (m, tuple(feats), hint)
        if key not in self.cache:
            self.cache[key] = self._search(m, feats, what, hint)
        got = self.cache[key]
        return None if isinstance(got, Pending) else got

    def _search(self, m: tuple[int, ...], feats: list[tuple[int, ...]], what: str, hint: Hint | None) -> Any:
        target = np.array(m, dtype=np.int64)
        if m in feats:
            return self._settle(m, self.known[m], what)
        if hint is not None and hint[0] in self.known:  # the op's own size rule, if it holds here
            a, c, r, d = hint[1]
            if np.array_equal((a * np.array(hint[0], dtype=np.int64) + r) // c + d, target):
                return self._settle(m, forms.floor_of(self.known[hint[0]], hint[1]), what)
        if feats:
            inputs = [(self.known[f], np.array(f, dtype=np.int64)) for f in feats]
            got = self._forms(m, target, inputs, what)
            if got is _NOFIT:
                got = self._combined(m, target, [self.known[f] for f in feats], what)
            if got is not _NOFIT:
                return got
        if m in self.known:
            return self.known[m]
        got = self._via_known(m, target, what)
        if got is not _NOFIT:
            return got
        deps = self._symbols(m)
        got = self._forms(m, target, [(self.known[self._obs(s)], self.columns[s]) for s in deps], what)
        return got if got is not _NOFIT else self._global(m, target, deps, what)

    def _forms(
        self, m: tuple[int, ...], target: np.ndarray, inputs: list[tuple[Size, np.ndarray]], what: str
    ) -> Any:
        """One input size through ``floor((a·u + r) / c) + d`` (or, when none fits, through
        ``e·floor((u + r) / c) + d``): proven when every candidate gives the same sizes at every
        probe."""
        found: list[tuple[Size, forms.Scaled]] = []
        for size, u in inputs:
            got, work = forms.floor_forms(u, target)
            self._spend(work)
            found += [(size, (f, 1, 0)) for f in got]
        for size, u in inputs if not found else ():
            more, work = forms.scaled_forms(u, target)
            self._spend(work)
            found += [(size, f) for f in more]
        if not found:
            return _NOFIT
        if len(found) == 1:
            return self._settle(m, _sized(*found[0]), what)
        if len(found) <= forms.MAX_FORMS:  # (more: the search stopped early, some are missing)
            first = self._rows(found[:1])[0]
            if all((self._rows(found[k : k + 256]) == first).all() for k in range(1, len(found), 256)):
                return self._settle(m, _sized(*found[0]), what)  # one function wherever probed
        pick = np.unique(np.linspace(0, len(found) - 1, min(SPLIT_ROWS, len(found))).astype(int))
        sizes = [_sized(*f) for f in found[:2]]
        return self._pend(what, m, sizes, self._rows([found[k] for k in pick]), len(found))

    def _rows(self, found: Sequence[tuple[Size, forms.Scaled]]) -> np.ndarray:
        rows = []
        for size, ((a, c, r, d), e, d0) in found:
            rows.append(e * ((a * size.at(self.probes) + r) // c + d) + d0)
        out = np.stack(rows)
        self._spend(out.size)
        return out

    def _via_known(self, m: tuple[int, ...], target: np.ndarray, what: str) -> Any:
        """``a·k + d`` of a size ``k`` fitted elsewhere in the graph: a table sliced to ``2·L - 1``
        rows in Python from L frames (wav2vec2-conformer's relative positions) has no input that
        carries L, and over the symbol alone many divisors near the true one fit the captures."""
        found: list[Size] = []
        for values, size in list(self.known.items()):
            u = np.array(values, dtype=np.int64)
            i, j = int(np.argmin(u)), int(np.argmax(u))
            du, dm = int(u[j] - u[i]), int(target[j] - target[i])
            if du == 0 or dm == 0 or dm % du:
                continue
            a = dm // du
            d = int(target[i]) - a * int(u[i])
            if np.array_equal(a * u + d, target):
                found.append(forms.combination([size, forms.constant(1)], [a, d]))
        self._spend(len(self.known) * len(target))
        if not found:
            return _NOFIT
        rows = np.stack([f.at(self.probes) for f in found])
        if (rows == rows[0]).all():
            return self._settle(m, found[0], what)
        return self._pend(what, m, found[:2], rows, len(found))

    def _combined(self, m: tuple[int, ...], target: np.ndarray, sizes: list[Size], what: str) -> Any:
        """Sums and products of input sizes: a concatenation, a flattening reshape."""
        one = forms.constant(1)
        sets: list[list[Size]] = []
        for a, b in itertools.combinations(sizes, 2):
            sets += [[one, a, b], [forms.product([a, b])], [one, forms.product([a, b])]]
        if len(sizes) > 2:
            sets.append([forms.product(sizes)])
        return self._linear(m, target, sets, what)

    def _global(self, m: tuple[int, ...], target: np.ndarray, deps: list[str], what: str) -> Any:
        """Polynomials, min / max and floors times other symbols, over the symbols the size
        moves with (the forms tract's TDim has)."""
        one = forms.constant(1)
        sym = {s: self.known[self._obs(s)] for s in deps}
        lin = [one, *sym.values()]
        sets = [lin]
        if len(deps) > 1:
            prod = forms.product(list(sym.values()))
            sets += [
                [one, prod],
                [*lin, prod],
                lin + [forms.product([sym[a], sym[b]]) for a, b in itertools.combinations(deps, 2)],
            ]
        sets += [[one, sym[s], forms.product([sym[s], sym[s]])] for s in deps]
        got = self._linear(m, target, sets, what)
        if got is not _NOFIT:
            return got
        for s, kind, c in itertools.product(deps, ("min", "max"), range(1, 65)):
            size = forms.extremum(s, kind, c)
            if np.array_equal(self._column(size), target):
                return self._settle(m, size, what)
        sets = []
        for s in deps if len(deps) > 1 else ():
            others = [sym[t] for t in deps if t != s]
            for k in range(2, 9):
                for c in range(-2 * k, 2 * k):
                    f = forms.quasi_size(forms.normal((s, 1, k, c, 0)))
                    sets.append([one, f, *others, *[forms.product([f, o]) for o in others]])
        return self._linear(m, target, sets, what)

    def _linear(self, m: tuple[int, ...], target: np.ndarray, sets: list[list[Size]], what: str) -> Any:
        for columns in sets:
            coefs = forms.solve([self._column(c) for c in columns], target)
            self._spend(len(columns) * len(target))
            if coefs is not None:
                return self._settle(m, forms.combination(columns, coefs), what)
        return _NOFIT

    def _column(self, size: Size) -> np.ndarray:
        return np.broadcast_to(np.asarray(size.fn(self.columns), dtype=np.int64), (len(self.points),))

    def _settle(self, m: tuple[int, ...], size: Size, what: str) -> Any:
        """Keep ``size`` for ``m``; one fitted earlier for the same sizes must agree with it."""
        old = self.known.get(m)
        if old is None or old is size:
            self.known[m] = size
            return size
        if np.array_equal(old.at(self.probes), size.at(self.probes)):
            return old
        rows = np.stack([old.at(self.probes), size.at(self.probes)])
        return self._pend(what, m, [old, size], rows)

    def _pend(
        self, what: str, m: tuple[int, ...], sizes: list[Size], rows: np.ndarray, count: int = 2
    ) -> Pending:
        p = Pending(what, m, sizes, rows, count)
        self.pending.append(p)
        self.known.setdefault(m, sizes[0])  # tentatively: the sizes after it are fitted too, so
        return p  # one round of captures can settle every undecided size of the graph

    # ---- helpers ------------------------------------------------------------------------
    def _obs(self, s: str) -> tuple[int, ...]:
        return tuple(p[s] for p in self.points)

    def _symbols(self, values: Sequence[int]) -> list[str]:
        return self.spec.depends(values) or list(self.spec.base)

    def _seen(self, values: Sequence[int]) -> str:
        pairs = [
            f"{v} at {', '.join(f'{s}={p[s]}' for s in self.spec.base)}"
            for v, p in zip(values, self.points, strict=False)
        ]
        return "; ".join(pairs[:12]) + ("; …" if len(pairs) > 12 else "")

    def _nofit(self, m: tuple[int, ...], what: str) -> DynamicAxisError:
        return not_dynamic(
            self.spec,
            self._symbols(m),
            f"the size {what} is no integer expression of its inputs' sizes or of the symbols"
            f" (seen {self._seen(m)})",
        )

    def _spend(self, work: int) -> None:
        self.work += int(work)
        if self.work > self.budget:
            raise LoweringError(
                f"the {self.frontend} front end gave up fitting the dynamic sizes after {self.work:,} steps"
                f" ({len(self.cache)} distinct sizes): the model has more distinct sizes than fitting"
                " handles; use frontend='export' or make some axes static"
            )


def _sized(size: Size, scaled: forms.Scaled) -> Size:
    form, e, d0 = scaled
    return forms.floor_of(size, form) if (e, d0) == (1, 0) else forms.scaled_size(size, scaled)


def _names(size: Size) -> list[str]:
    return size.expr.symbols if isinstance(size.expr, SymDim) else []

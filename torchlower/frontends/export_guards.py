"""torch.export's refusal of a dynamic axis, read: which symbols, the fixes it suggests, and the
sizes on both sides of each guard it asked for.

A refusal reads "Constraints violated (S)", then guards in the input's terms (``Not all values
of S = L['x'].size()[3] ... satisfy the generated guard (L['x'].size()[3] // 2) != 1.``) and
"Suggested fixes" (``S = 2*_S``, ``S = 2``, ``S = Dim('S', min=4, max=999)``). When the export
front end exports size-obliviously instead, the program may differ from the model exactly where
a guard would have split the sizes, so the check runs on both sides of each split.
"""

from __future__ import annotations

import re
from typing import Any

import sympy

from torchlower.core.dynamic_forms import Form

CONSTRAINTS = re.compile(r"Constraints violated \(([\w, ]+)\)")
GUARD = re.compile(r"satisfy the generated guard (.+?)\.(?:\s|$)")
_FIX = re.compile(r"(\w+) = (?:Dim\('\w+'(?:, min=(\d+))?(?:, max=(\d+))?\)|(\d+)(?![\d*]))")
_MULTIPLE = re.compile(r"(\w+) = (\d+)\*\w+(?: ([+-]) (\d+))?\s*$", re.M)
_SIZE = re.compile(r"L\['(\w+)'\](?:\[(\d+)\])?\.size\(\)\[(\d+)\]")
_SCAN = 64  # sizes above the lower bound scanned for a guard's splits
_SPLITS = 3  # splits per symbol checked (each adds two sizes at most)


def suggested_fixes(text: str) -> list[tuple[str, str, str, str]]:
    """torch's suggested fixes as ``(symbol, min, max, constant)``, empty strings where absent."""
    return _FIX.findall(text.split("Suggested fixes:")[-1])


def multiples(text: str, symbols: list[str]) -> dict[str, tuple[int, int]]:
    """torch.export's suggested ``H = 32*_H`` / ``W = 4*_W - 1`` as ``{symbol: (k, c)}``."""
    found = {}
    for sym, k, op, c in _MULTIPLE.findall(text.split("Suggested fixes:")[-1]):
        if sym in symbols and int(k) > 1:
            found[sym] = (int(k), int(c or 0) * (-1 if op == "-" else 1))
    return found


def asked(spec: Any, text: str, symbols: list[str]) -> list[str]:
    """The suggestions for ``symbols`` as guards (``S = 2*_S``, ``S = 2``, ``S >= 4``,
    ``S <= 999``); without any, torch's guards in the symbols' names (``(-2 + S) != 1``)."""
    out = [f"{s} = {Form('_' + s, k, c).text()}" for s, (k, c) in sorted(multiples(text, symbols).items())]
    for sym, lo, hi, const in suggested_fixes(text):
        if sym in symbols:
            out += [f"{sym} = {const}"] * bool(const) + [f"{sym} >= {lo}"] * bool(lo)
            out += [f"{sym} <= {hi}"] * bool(hi)
    if not out:
        named = (_SIZE.sub(lambda m: _symbol(spec, m) or "?", g) for g in GUARD.findall(text))
        out = list(dict.fromkeys(g.replace("IntInfinity()", "inf") for g in named))
    return out


def guard_sides(spec: Any, symbols: list[str], text: str) -> dict[str, list[int]]:
    """Sizes just on each side of the guards torch.export asked for, inside the declared bounds:
    ``S = 2*_S`` → a multiple and the size after it, ``S = 2`` → 2 and 3, ``min=4`` → 3 and 4,
    ``max=999`` → 999 and 1000, and where a guard's truth changes between two sizes (``S // 2 != 1``
    → 1 | 2 and 3 | 4), both of them."""
    sides: dict[str, set[int]] = {s: set() for s in symbols}
    for sym, (k, c) in multiples(text, symbols).items():
        on = next(v for v in range(spec.base[sym], spec.base[sym] + k) if (v - c) % k == 0)
        sides[sym].update((on, on + 1))
    for sym, lo, hi, const in suggested_fixes(text):
        if sym in symbols:
            for at, below in ((const, 0), (lo, 1), (hi, 0)):  # the guard's size and its other side
                if at:
                    sides[sym].update((int(at) - below, int(at) - below + 1))
    for sym, splits in _splits(spec, symbols, text).items():
        sides[sym].update(v for split in splits[:_SPLITS] for v in split)
    out = {}
    for sym, values in sides.items():
        lo, hi = spec.bounds.get(sym, (1, None))
        out[sym] = sorted(v for v in values if lo <= v and (hi is None or v <= hi))
    return out


def _splits(spec: Any, symbols: list[str], text: str) -> dict[str, list[tuple[int, int]]]:
    """``{symbol: [(v, v + 1)…]}`` where a guard of that symbol alone changes its truth, scanned
    from the symbol's lower bound (the guards ask about small derived sizes: is ``S - 2`` 1?)."""
    out: dict[str, list[tuple[int, int]]] = {s: [] for s in symbols}
    for guard in dict.fromkeys(GUARD.findall(text)):
        named = {_symbol(spec, m) for m in _SIZE.finditer(guard)}
        if len(named) != 1 or None in named or not named <= set(symbols):
            continue
        (sym,) = named
        lo, hi = spec.bounds.get(sym, (1, None))
        top = lo + _SCAN if hi is None else min(hi, lo + _SCAN)
        truth = _truth(guard, range(lo, top + 1))
        for i in range(len(truth) - 1):
            split = (lo + i, lo + i + 1)
            if None not in truth[i : i + 2] and truth[i] != truth[i + 1] and split not in out[sym]:
                out[sym].append(split)
    return {s: sorted(v) for s, v in out.items() if v}


def _symbol(spec: Any, match: re.Match[str]) -> str | None:
    """The symbol of ``L['x'].size()[3]`` (``L['args'][1].size()[0]`` for ``*args``), or None."""
    name, index, axis = match.group(1), match.group(2), int(match.group(3))
    i = int(index) if index is not None else (spec.names.index(name) if name in spec.names else -1)
    return spec.axes.get(i, {}).get(axis)


def _truth(guard: str, sizes: range) -> list[bool | None]:
    """Whether ``guard`` (its sizes all one symbol's) holds at each of ``sizes``; None where
    it cannot be read or evaluated."""
    n = sympy.Symbol("n", integer=True, positive=True)
    try:
        expr = sympy.parse_expr(
            _SIZE.sub("n", guard), local_dict={"n": n, "IntInfinity": lambda: sympy.oo}, evaluate=False
        )
    except (SyntaxError, TypeError, ValueError, ZeroDivisionError, AttributeError, NameError):
        return [None] * len(sizes)
    out: list[bool | None] = []
    for v in sizes:
        try:
            out.append(bool(expr.subs(n, v)))
        except (TypeError, ValueError, ZeroDivisionError, AttributeError):
            out.append(None)
    return out

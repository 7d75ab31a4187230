"""Where to capture the model next: probe sizes that tell undecided size candidates apart.

Candidates of an undecided size are evaluated at a grid of probe sizes (each symbol moved alone
over a window around its example size, then all together); the next captures are the probes
that leave the fewest candidates in the worst case, nearest the example first (a smaller move
is a cheaper trace). Greedy and deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from torchlower.core.dynamic import Spec


def grid(spec: Spec, reach: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Probe sizes (symbol -> values) and each probe's distance from the example. A window
    starts at the smallest size already captured (the model ran there) or the lower bound."""
    base = spec.base
    window = {}
    for s, v in base.items():
        lo, hi = spec.bounds.get(s, (1, None))
        top = v + reach if hi is None else min(hi, v + reach)
        window[s] = (max(lo, min(p[s] for p in spec.points), v - reach), top)
    lines: list[dict[str, np.ndarray]] = []
    for s, (lo, hi) in window.items():
        vals = np.arange(lo, hi + 1, dtype=np.int64)
        lines.append({t: vals if t == s else np.full(len(vals), base[t], dtype=np.int64) for t in base})
    if len(base) > 1:
        lo = max(window[s][0] - v for s, v in base.items())
        hi = min(window[s][1] - v for s, v in base.items())
        deltas = np.arange(lo, hi + 1, dtype=np.int64)
        lines.append({s: v + deltas for s, v in base.items()})
    probes = {s: np.concatenate([line[s] for line in lines]) for s in base}
    cost = sum(np.abs(probes[s] - v) for s, v in base.items())
    return probes, np.asarray(cost, dtype=np.int64)


def choose(
    probes: dict[str, np.ndarray], cost: np.ndarray, rows: Sequence[np.ndarray], taken: set[Any], room: int
) -> list[dict[str, int]]:
    """Up to ``room`` probes; ``rows`` holds each undecided size's candidates at every probe."""
    names = list(probes)
    keys = zip(*(probes[s].tolist() for s in names), strict=True)
    free = np.array([tuple(sorted(zip(names, k, strict=True))) not in taken for k in keys])
    labels = [np.zeros(len(r), dtype=np.int64) for r in rows]  # candidates told apart so far
    chosen: list[int] = []
    for _ in range(room):
        now = sum(int(np.bincount(lab).max()) for lab in labels)
        left = sum(largest(lab[:, None] * 1_000_003 + r) for r, lab in zip(rows, labels, strict=True))
        left = np.where(free, left, now)  # candidates left in the worst case
        best = int(np.lexsort((cost, left))[0])
        if left[best] >= now:
            break
        chosen.append(best)
        free[best] = False
        for k, r in enumerate(rows):
            pairs = np.stack([labels[k], r[:, best]], 1)
            labels[k] = np.unique(pairs, axis=0, return_inverse=True)[1].ravel()
    return [{s: int(probes[s][k]) for s in names} for k in chosen]


def mirrored(spec: Spec, points: list[dict[str, int]], taken: set[Any], room: int) -> list[dict[str, int]]:
    """Where two symbols' sizes were seen equal (``H / 4`` and ``W / 4`` deep in a CNN), the
    other symbols' sizes are undecided the same way, though not yet seen: the same move of each
    other symbol, in the same round."""
    base = spec.base
    out: list[dict[str, int]] = []
    for point in points:
        moved = [s for s in base if point[s] != base[s]]
        if len(moved) != 1:
            continue
        for t in base:
            other = {**base, t: base[t] + point[moved[0]] - base[moved[0]]}
            lo, hi = spec.bounds.get(t, (1, None))
            key = tuple(sorted(other.items()))
            inside = other[t] >= lo and (hi is None or other[t] <= hi)
            if t != moved[0] and len(out) < room and inside and key not in taken:
                out.append(other)
                taken.add(key)
    return out


def largest(keys: np.ndarray) -> np.ndarray:
    """The largest group of equal values in each column."""
    ordered = np.sort(keys, axis=0)
    same = ordered[1:] == ordered[:-1]
    count = np.cumsum(same, axis=0)
    run = count - np.maximum.accumulate(np.where(same, 0, count), axis=0)
    return 1 + (run.max(axis=0) if len(run) else 0)

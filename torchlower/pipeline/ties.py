"""Tie groups in the check: outputs that rank tied values compared up to the order of the ties.

``topk`` / ``sort`` / ``argmax`` of equal values have no defined order: torch and tract may
return the tied elements in another order (an RT-DETR head's 300 best queries, two of which
score the same). So where an output is off beyond tolerance at a point, the reference is run
there once more while recording every ranking op (``aten.topk``, ``sort``, ``argmax`` /
``argmin``, ``max.dim`` / ``min.dim``, their ranked input and results), and the output passes
as *tied* when

- it **is** the indices of a recorded ranking, and tract's indices are valid, distinct where
  the op selects distinct elements (topk, sort), and pick values equal to the ones torch's
  indices pick (the values compared as numbers, within the tie tolerance); or
- its leading axes are a recorded ``topk`` / ``sort``'s values (what was gathered by those
  indices: boxes, labels): then per row, within each *tie group* (a run of ranked values each
  within the tie tolerance of the next), torch's and tract's sub-tensors are equal as
  multisets (each within the check's tolerance).

The tie tolerance is 1e-4 of the ranked values' largest finite magnitude (at least 1e-4): tract
and torch round the values being ranked differently by about an ulp, so near-ties swap too.
Not covered: a tie group cut by ``k`` whose members' gathered rows differ (tract may keep
another of the tied queries; that is refused, not passed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchlower.core.comparison import OutputError, differences

Reference = Callable[[Sequence[torch.Tensor]], list[torch.Tensor]]

_aten = torch.ops.aten
# op -> (is a selection of distinct elements, where its indices are in its results)
_RANKINGS = {
    _aten.topk.default: (True, 1),
    _aten.sort.default: (True, 1),
    _aten.sort.stable: (True, 1),
    _aten.argmax.default: (False, 0),
    _aten.argmin.default: (False, 0),
    _aten.max.dim: (False, 1),
    _aten.min.dim: (False, 1),
}


@dataclass(frozen=True)
class Ranking:
    """One ranking op as run: ``ranked`` along ``dim``; ``indices`` with that axis kept."""

    op: str
    ranked: np.ndarray
    dim: int
    indices: np.ndarray  # as returned (the axis may be gone: argmax without keepdim)
    kept: np.ndarray  # the same with ``dim`` kept
    values: np.ndarray | None  # topk / sort: the ranked values in order (tie groups)
    distinct: bool

    @property
    def tie_tolerance(self) -> float:
        finite = self.ranked[np.isfinite(self.ranked)] if self.ranked.dtype.kind == "f" else self.ranked
        return 1e-4 * max(1.0, float(np.abs(finite).max(initial=0.0)))


class _Recorder(TorchDispatchMode):
    """Records every ranking op; with ``replace``, the k-th one returns the indices given for
    it (and the values they pick) instead of its own: the model run with tract's tie order."""

    def __init__(self, replace: dict[int, np.ndarray] | None = None) -> None:
        super().__init__()
        self.found: list[Ranking | None] = []
        self.replace = replace or {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        if func not in _RANKINGS:
            return out
        found = _ranking(func, args, kwargs or {}, out)
        given = self.replace.get(len(self.found))
        self.found.append(found)
        if found is None or given is None:
            return out
        kept = torch.from_numpy(given.reshape(found.kept.shape).astype(np.int64))
        at = _RANKINGS[func][1]
        results = list(out) if isinstance(out, tuple | list) else [out]
        results[at] = kept.reshape(results[at].shape).to(results[at].dtype)
        if at == 1:  # values beside the indices: the ones tract's indices pick
            picked = torch.gather(args[0], found.dim % args[0].dim(), kept) if args[0].dim() else args[0]
            results[0] = picked.reshape(results[0].shape)
        return type(out)(results) if isinstance(out, tuple | list) else results[0]


def _ranking(func: object, args: tuple, kwargs: dict, out: object) -> Ranking | None:
    distinct, at = _RANKINGS[func]  # type: ignore[index]
    x = args[0]
    if not isinstance(x, torch.Tensor) or x.is_complex() or x.dim() == 0:
        return None
    results = out if isinstance(out, tuple | list) else (out,)
    indices = results[at].detach().clone()
    name = str(func).split(".")[1]
    place = 2 if name == "topk" else 1  # the dim argument's position (sort.stable: keyword only)
    positional = func != _aten.sort.stable and len(args) > place
    dim = args[place] if positional else kwargs.get("dim", -1 if name in ("topk", "sort") else None)
    values = results[0].detach().clone() if name in ("topk", "sort") else None
    ranked = x.detach().clone()
    if dim is None:  # argmax over everything: the flat index
        ranked, dim = ranked.reshape(-1), 0
    dim = dim % ranked.dim()
    kept = indices if indices.dim() == ranked.dim() else indices.unsqueeze(dim)
    if kept.dim() != ranked.dim():
        return None
    as_np = lambda t: t.numpy() if t is not None else None  # noqa: E731
    return Ranking(name, ranked.numpy(), dim, indices.numpy(), kept.numpy(), as_np(values), distinct)


def record(
    reference: Reference, inputs: Sequence[torch.Tensor]
) -> tuple[list[Ranking | None], list[np.ndarray]]:
    """Every ranking op ``reference`` runs at ``inputs`` (on copies; RNG and grad untouched),
    in call order (None for one this module does not read, a 0-d argmax), and its outputs."""
    recorder = _Recorder()
    with torch.no_grad(), torch.random.fork_rng(devices=[]), recorder:
        outputs = [t.detach().numpy() for t in reference([t.clone() for t in inputs])]
    return recorder.found, outputs


def tract_order(
    rankings: Sequence[Ranking | None], want: Sequence[np.ndarray], got: Sequence[np.ndarray]
) -> dict[int, np.ndarray]:
    """The recorded rankings whose indices are a model output, mapped to tract's indices there
    when those pick tied values (``_same_picks``) but differ from torch's."""
    found = {}
    for k, r in enumerate(rankings):
        for w, g in zip(want, got, strict=True):
            if r is None or r.indices.shape != w.shape or not np.array_equal(r.indices, w):
                continue
            if not np.array_equal(w, g) and _same_picks(r, g):
                found[k] = g
            break
    return found


def replay(
    reference: Reference, inputs: Sequence[torch.Tensor], order: dict[int, np.ndarray]
) -> list[np.ndarray]:
    """``reference`` at ``inputs`` with the rankings in ``order`` returning tract's indices."""
    recorder = _Recorder(order)
    with torch.no_grad(), torch.random.fork_rng(devices=[]), recorder:
        return [t.detach().numpy() for t in reference([t.clone() for t in inputs])]


def untie(
    error: OutputError, want: np.ndarray, got: np.ndarray, rankings: Sequence[Ranking | None]
) -> OutputError:
    """``error`` passed as tied when a recorded ranking's tie groups explain it (module docstring)."""
    for r in rankings:
        groups = _tie_groups(r) if r is not None else None
        if groups is not None and _same_per_group(r, groups, want, got, error.tolerance):
            n = sum(len(g) > 1 for row in groups for g in row)
            return replace(
                error, tied=True, note=f"equal up to the order within {n} tie group(s) of a {r.op}"
            )
    return error


def _same_picks(r: Ranking, got: np.ndarray) -> bool:
    """tract's indices valid, distinct for topk / sort, and picking values tied with torch's."""
    if got.dtype.kind not in "iu":
        return False
    g = got.reshape(r.kept.shape).astype(np.int64)
    size = r.ranked.shape[r.dim]
    if g.min(initial=0) < 0 or g.max(initial=0) >= size:
        return False
    if r.distinct and np.any(np.diff(np.sort(g, axis=r.dim), axis=r.dim) == 0):
        return False
    ranked = torch.from_numpy(r.ranked)
    theirs = torch.gather(ranked, r.dim, torch.from_numpy(g)).numpy()
    ours = torch.gather(ranked, r.dim, torch.from_numpy(r.kept.astype(np.int64))).numpy()
    return bool(np.all(differences(ours, theirs) <= r.tie_tolerance))


def _tie_groups(r: Ranking) -> list[list[list[int]]] | None:
    """Per row of a topk / sort over its last axis: runs of positions whose values tie."""
    if r.values is None or r.dim != r.values.ndim - 1 or r.values.dtype.kind not in "fiu":
        return None
    rows = r.values.reshape(-1, r.values.shape[-1]).astype(np.float64)
    tol = r.tie_tolerance
    out = []
    for row in rows:
        groups, start = [], 0
        for k in range(1, len(row) + 1):
            if k == len(row) or not abs(row[k] - row[k - 1]) <= tol:
                groups.append(list(range(start, k)))
                start = k
        out.append(groups)
    return out if any(len(g) > 1 for row in out for g in row) else None


def _same_per_group(
    r: Ranking, groups: list[list[list[int]]], want: np.ndarray, got: np.ndarray, tol: float
) -> bool:
    lead = r.values.shape if r.values is not None else ()
    if want.shape[: len(lead)] != lead or got.shape != want.shape:
        return False
    width = int(np.prod(want.shape[len(lead) :], dtype=np.int64))
    w = want.reshape(len(groups), lead[-1], width)
    g = got.reshape(len(groups), lead[-1], width)
    for b, row in enumerate(groups):
        for group in row:
            if not _multiset_equal(w[b, group], g[b, group], tol):
                return False
    return True


def _multiset_equal(want: np.ndarray, got: np.ndarray, tol: float) -> bool:
    """The rows of ``got`` are those of ``want`` in some order, each within ``tol``."""
    dist = differences(want[:, None, :], got[None, :, :]).max(axis=-1, initial=0.0)
    free = np.ones(len(got), dtype=bool)
    for i in range(len(want)):
        close = np.flatnonzero(free & (dist[i] <= tol))
        if close.size == 0:
            return False
        free[close[np.argmin(dist[i, close])]] = False
    return True

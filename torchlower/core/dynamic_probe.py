"""Eager probes of a dynamic spec before any capture: which multiples the model needs, and which
check sizes PyTorch itself refuses.

A U-Net concatenates skips of its encoder with its upsampled decoder, so it only runs where H is a
multiple of its total stride (32). When PyTorch fails one size above the example but runs a
multiple above it, the symbol becomes that multiple (``H = 32*_H``: ``dynamic_forms``) for every
front end, so the capture moves ``_H`` and the archive declares and refuses by the same rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchlower.core import dynamic_forms
from torchlower.core.dynamic_forms import Form
from torchlower.errors import DynamicAxisError

# multiples tried, smallest first and at most the example's size (an example of 32*h is >= 32); the
# multiple found is then reduced to its smallest divisor that runs (96 → 24, 112 → 14), so one run
# per candidate finds strides 2…128 and 14, 24, 48
CANDIDATES = (2, 4, 8, 16, 32, 64, 96, 112, 128)


def probe(spec: Any, run: Any, example: Sequence[torch.Tensor]) -> None:
    """Adopt every multiple the model needs (noted in ``spec.notes``), then drop the check
    sizes where PyTorch fails (``probe_checks``)."""
    for s, k in needed_multiples(spec, run, example).items():
        v = spec.base[s]
        form = adopt_multiple(spec, s, k)
        spec.notes.append(
            f"dynamic axis {spec.where([form.symbol])}: PyTorch runs only where {s} is {form.rule()}"
            f" (it fails at {s}={v + 1}, runs at {s}={v + k}); the archive declares {s} = {form.text()}"
            " and refuses other sizes"
        )
    probe_checks(spec, run, example)


def probe_checks(spec: Any, run: Any, example: Sequence[torch.Tensor]) -> None:
    """Run the model eagerly at the check sizes; a size where PyTorch itself fails (a kernel
    larger than the input) is dropped and remembered in ``spec.skipped`` — the report says so —
    instead of failing the export."""
    for point in spec.check_points():
        try:
            with torch.no_grad():
                run(spec.example_at(example, point))
        except Exception as exc:
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else repr(exc)
            spec.skipped.append((point, f"PyTorch fails there ({type(exc).__name__}: {first})"))
            spec.points.remove(point)
            if spec.far is not None and spec.far > 0:
                far = spec.far_point
                spec.far = spec.points.index(far) if far in spec.points else None


def needed_multiples(spec: Any, run: Any, example: Sequence[torch.Tensor]) -> dict[str, int]:
    """``{symbol: k}`` for each symbol where PyTorch fails at ``size + 1`` but runs at ``size + k``
    (the smallest such k among the candidates and their divisors)."""
    out: dict[str, int] = {}
    for s, v in spec.base.items():
        lo, hi = spec.bounds.get(s, (1, None))

        def runs(value: int, s: str = s, lo: int = lo, hi: int | None = hi) -> bool | None:
            if value < lo or (hi is not None and value > hi):
                return None
            return _runs_at(run, spec, example, s, value)

        if runs(v + 1) is not False:
            continue
        failed = {1}
        for k in (k for k in CANDIDATES if k <= max(v, 2)):  # an example of 32*h has v >= 32
            found = runs(v + k)
            if found is None:
                break
            if not found:
                failed.add(k)
                continue
            divisors = [d for d in range(2, k) if k % d == 0 and d not in failed]
            out[s] = next((d for d in divisors if runs(v + d)), k)
            break
    return out


def adopt_multiple(spec: Any, s: str, k: int, c: int | None = None) -> Form:
    """Make symbol ``s`` of ``spec`` a multiple: its axes become ``k*_s + c`` (``c`` from the
    example unless given), its bounds those of ``_s``, the capture points are drawn again.
    Returns the new form of ``s``; a ``DynamicAxisError`` when the bounds leave no other size."""
    v = spec.base[s]
    new = dynamic_forms.adopted(s, k, v) if c is None else Form(f"_{s}", k, c, label=s)
    while new.symbol in spec.base:
        new = Form("_" + new.symbol, new.k, new.c, new.label)
    lo, hi = spec.bounds.get(s, (1, None))
    value = new.value(v)
    root_lo, root_hi = new.root_bounds(lo, hi)
    if value is None or root_lo > value or (root_hi is not None and root_hi <= root_lo):
        span = f"{lo}..{hi if hi is not None else 'inf'}"
        raise DynamicAxisError(
            f"{spec.where([s])} cannot be dynamic: the model needs {s} = {new.text()} ({new.rule()}), and"
            f" its bounds {span} leave no other such size. Widen the bounds or make the axis static"
        )
    spec.base = {(new.symbol if t == s else t): (value if t == s else n) for t, n in spec.base.items()}
    spec.bounds = {(new.symbol if t == s else t): ((root_lo, root_hi) if t == s else b)
                   for t, b in spec.bounds.items()}  # fmt: skip
    for i, by_axis in spec.axes.items():
        for axis, sym in by_axis.items():
            if sym == s:
                spec.forms.setdefault(i, {})[axis] = spec.form(i, axis, sym).compose(new)
                by_axis[axis] = new.symbol
    spec.skipped = [(p, why) for p, why in spec.skipped if s not in p]
    spec.extra_checks = [p for p in spec.extra_checks if s not in p]
    spec.sample()
    return new


def lowest_size(spec: Any, run: Any, example: Sequence[torch.Tensor], s: str) -> int | None:
    """The smallest size of ``s`` PyTorch runs the model at, bisected between the declared lower
    bound and the example (the other symbols at the example's sizes); None for a symbol the
    spec does not move or whose lower bound already runs. Assumes a model that runs at a size
    runs at every larger one; the size found is checked in tract all the same."""
    if s not in spec.base:
        return None
    lo = spec.bounds.get(s, (1, None))[0]

    def runs(value: int) -> bool:
        return _runs_at(run, spec, example, s, value)

    fails, ok = lo, spec.base[s]
    if fails >= ok or runs(fails):
        return None
    while ok - fails > 1:
        mid = (fails + ok) // 2
        fails, ok = (fails, mid) if runs(mid) else (mid, ok)
    return ok


def _runs_at(run: Any, spec: Any, example: Sequence[torch.Tensor], s: str, value: int) -> bool:
    """Whether eager PyTorch runs the example with symbol ``s`` at ``value``."""
    try:
        with torch.no_grad():
            run(spec.example_at(example, {**spec.base, s: value}))
    except Exception:
        return False
    return True

"""The check of an artifact at several input points: the example and fresh inputs like it.

One example proves little: a trace that froze a branch, a scale taken from the input or a
data-dependent shape all pass on the very input they were traced with. So the check also runs
at ``RANDOM_POINTS`` fresh inputs drawn to resemble the example — same dtype and shape; floats
with the example's mean and standard deviation (kept on its side of zero when it is all
non-negative or all non-positive, so ``log`` / ``sqrt`` inputs stay in their domain); integers
within the example's min..max (a quarter of the elements redrawn uniformly, the rest kept, so an
attention mask stays mostly a mask), or a shuffle of the example when its values are all
distinct (indices, permutations); bools at random — with fixed seeds (deterministic) from a
local ``torch.Generator`` (the user's RNG state is untouched). Under dynamic axes the points at
other sizes are added. tract loads the artifact once for all points.

A point where PyTorch itself fails (a random input the model rejects, a size it cannot run
at) is skipped and reported as such, never counted as checked.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from torchlower.core.comparison import OutputError, compare, judge
from torchlower.core.tolerance import output_scale
from torchlower.errors import CheckError
from torchlower.nnef.tract import run_points_in_tract
from torchlower.pipeline import conditioning, float64, special, ties

RANDOM_POINTS = 3  # fresh inputs checked besides the example
_KEEP = 0.75  # share of integer elements kept from the example (ids and masks stay plausible)
SEED = 1300  # point k is drawn with seed SEED + k

Reference = Callable[[Sequence[torch.Tensor]], list[torch.Tensor]]
Tolerance = Callable[[Sequence[np.ndarray]], float]


@dataclass
class CheckPoint:
    """One input set the artifact was checked at, with the error of every output there."""

    label: str  # "example", "random 1 (seed 1301)", "S=3"
    inputs: list[tuple[int, ...]]  # the input shapes
    errors: list[OutputError] = field(default_factory=list)
    skipped: str | None = None  # why this point was not checked (PyTorch failed there)

    @property
    def ok(self) -> bool:
        return self.skipped is None and all(e.ok for e in self.errors)


@dataclass(frozen=True)
class Point:
    label: str
    inputs: tuple[torch.Tensor, ...]
    expected: list[torch.Tensor] | None = None  # already known (the example's outputs)
    special: str | None = None  # the special-values point: "auto" or "strict" (pipeline/special.py)


def special_point(example: Sequence[torch.Tensor], strict: bool = False) -> list[Point]:
    """The special-values point of ``example`` (none without float inputs); more than one when
    an input is too small to hold every special value at once (``special.rounds``)."""
    if not special.has_float(example):
        return []
    mode = special.STRICT if strict else special.AUTO
    return [
        Point(
            special.LABEL if k == 0 else f"{special.LABEL} {k + 1}",
            tuple(special.with_specials(t, k) for t in example),
            special=mode,
        )
        for k in range(special.rounds(example))
    ]


def random_points(
    example: Sequence[torch.Tensor], count: int = RANDOM_POINTS, reference: Reference | None = None
) -> list[Point]:
    """``count`` input sets resembling ``example`` (see the module docstring), seeds fixed.
    With ``reference``: square float inputs are drawn well-conditioned when the model inverts
    matrices (``pipeline/conditioning.py``), and the labels say so."""
    inverts = conditioning.inverting_ops(reference, example) if reference is not None else []
    square = [conditioning.is_square(t) for t in example] if inverts else [False] * len(example)
    said = f", well-conditioned for {', '.join(inverts)}" if any(square) else ""
    out = []
    for k in range(1, count + 1):
        g = torch.Generator().manual_seed(SEED + k)
        drawn = [like(t, g) for t in example]
        drawn = [conditioning.well_conditioned(d) if s else d for d, s in zip(drawn, square, strict=True)]
        out.append(Point(f"random {k} (seed {SEED + k}{said})", tuple(drawn)))
    return out


def like(t: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """A fresh tensor resembling ``t``: its dtype and shape, values of its kind and spread."""
    if t.is_quantized or t.is_complex() or t.numel() == 0:
        return t.clone()
    if t.dtype == torch.bool:
        return torch.rand(t.shape, generator=g) < 0.5
    flat = t.detach().reshape(-1)
    if t.is_floating_point():
        finite = flat[torch.isfinite(flat)].double()
        if finite.numel() == 0:
            finite = torch.zeros(1, dtype=torch.float64)
        mean = float(finite.mean())
        std = float(finite.std()) if finite.numel() > 1 else 0.0
        if not std > 0:
            std = max(abs(mean), 1.0)
        draw = torch.randn(t.shape, generator=g, dtype=torch.float64) * std + mean
        lo, hi = float(finite.min()), float(finite.max())
        if lo >= 0 and hi > 0:
            draw = draw.abs()
        elif hi <= 0 and lo < 0:
            draw = -draw.abs()
        return draw.to(t.dtype)
    lo, hi = int(flat.min()), int(flat.max())
    if t.dim() == 1 and flat.numel() > 1 and bool((flat[1:] >= flat[:-1]).all()):
        # kept sorted between the example's first and last values: offsets and cumulative lengths
        # (embedding_bag's start at 0, do not decrease and end at the index count; a permutation of
        # them made torch read out of bounds)
        drawn = torch.randint(lo, hi + 1, t.shape, generator=g, dtype=torch.int64).sort().values
        drawn[0], drawn[-1] = int(flat[0]), int(flat[-1])
        return drawn.to(t.dtype)
    if flat.numel() > 1 and flat.unique().numel() == flat.numel():
        return flat[torch.randperm(flat.numel(), generator=g)].reshape(t.shape).clone()
    drawn = torch.randint(lo, hi + 1, t.shape, generator=g, dtype=torch.int64).to(t.dtype)
    keep = torch.rand(t.shape, generator=g) < _KEEP
    return torch.where(keep, t, drawn)


@dataclass
class Outcome:
    points: list[CheckPoint]
    original: list[CheckPoint]  # against ``original`` (compressed exports), same inputs
    first_outputs: list[np.ndarray] = field(default_factory=list)  # tract's, at the first point

    def errors(self, original: bool = False) -> list[OutputError]:
        """Every checked output at every point, named ``out`` (example) or ``out (label)``."""
        return [e for p in (self.original if original else self.points) for e in p.errors]


def check_points(
    artifact: Path,
    points: Sequence[Point],
    reference: Reference,
    names: Sequence[str],
    tolerance: Tolerance,
    original: Reference | None = None,
    against: str = "PyTorch",
    shown: Path | None = None,
    wide: float64.Reference | None = None,
) -> Outcome:
    """Run ``artifact`` at every point (one tract load) and compare with ``reference``.

    Raises ``CheckError`` naming the point and output when one differs beyond tolerance
    (``against`` names the reference, ``shown`` the path the user knows the artifact by).
    ``original`` (compressed exports): the same tract outputs compared with the original
    model too — informative, it never fails the check.
    ``wide``: ``reference`` in float64 (``pipeline/float64.py``); an output off beyond tolerance
    at a point is judged against it there (``comparison.judge``): ill-conditioned, or wrong.
    """
    checked: list[CheckPoint] = []
    wanted: list[tuple[Point, list[np.ndarray]]] = []
    finite: list[bool] = []  # per output: finite at the first point (the example)
    for p in points:
        cp = CheckPoint(p.label, [tuple(t.shape) for t in p.inputs])
        checked.append(cp)
        try:
            outputs = p.expected if p.expected is not None else _eager(reference, p.inputs)
        except Exception as exc:
            if p is points[0]:
                raise
            cp.skipped = f"PyTorch fails there ({type(exc).__name__}: {_first_line(exc)})"
            continue
        arrays = [t.detach().numpy() for t in outputs]
        if p.special == special.AUTO and (why := special.skip_reason(outputs)) is not None:
            cp.skipped = why
            continue
        if p.special is not None:
            pass  # compared position by position, NaN and infinities included
        elif p is points[0]:
            finite = [_all_finite(a) for a in arrays]
        elif any(f and not _all_finite(a) for f, a in zip(finite, arrays, strict=False)):
            # a drawn input outside the model's domain (a fully masked row, log of a negative):
            # PyTorch's own result is NaN/inf there, so there is nothing meaningful to compare
            cp.skipped = "PyTorch's output is not finite at this drawn input (finite at the example)"
            continue
        wanted.append((p, arrays))
    live = [cp for cp in checked if cp.skipped is None]

    def arrays_of(items: list[tuple[Point, list[np.ndarray]]]) -> list[list[np.ndarray]]:
        return [[t.detach().numpy() for t in p.inputs] for p, _ in items]

    try:
        try:
            actual = run_points_in_tract(artifact, arrays_of(wanted))
        except CheckError as exc:  # tract may abort on NaN-derived indices (grid_sample): retry without
            auto = [k for k, (p, _) in enumerate(wanted) if p.special == special.AUTO]
            if not auto:
                raise
            k = auto[0]
            live[k].skipped = f"tract cannot run at special values ({_first_line(exc)})"
            live, wanted = live[:k] + live[k + 1 :], wanted[:k] + wanted[k + 1 :]
            actual = run_points_in_tract(artifact, arrays_of(wanted))
    except CheckError as exc:
        text = str(exc) if shown is None else str(exc).replace(str(artifact.resolve()), str(shown))
        text = text if shown is None else text.replace(str(artifact), str(shown))
        raise CheckError(_name_input_set(text, [p.label for p, _ in wanted]), exc.errors) from exc
    base = wanted[0][1] if wanted else []  # the example's outputs: the special point's scale
    for cp, (p, want), got in zip(live, wanted, actual, strict=True):
        labelled = [n if p is points[0] else f"{n} ({p.label})" for n in names]
        if p.special is None:
            cp.errors = compare(labelled, want, got, tolerance(want))
        else:
            cp.errors = compare(labelled, want, got, tolerance(base), scale=output_scale(base))
        if not cp.ok:
            cp.errors = _untied(cp.errors, p.inputs, want, got, reference)
        if wide is not None and not cp.ok:
            judged = _judged(cp.errors, p.inputs, want, got, wide)
            if p.special is not None:  # NaN where torch-f32 has NaN: float64's inf is no excuse there
                pairs = zip(cp.errors, judged, want, got, strict=True)
                judged = [j if same_specials(w, g) else e for e, j, w, g in pairs]
            cp.errors = judged
        if p.special == special.AUTO and not cp.ok:  # found, said, not counted (check="special" is)
            cp.skipped = special.difference(failure(e) for e in cp.errors if not e.ok)
            cp.errors = []
    originals: list[CheckPoint] = []
    if original is not None:
        for cp, (p, _), got in zip(live, wanted, actual, strict=True):
            want = [t.detach().numpy() for t in _eager(original, p.inputs)]
            labelled = [e.name for e in cp.errors]
            originals.append(CheckPoint(cp.label, cp.inputs, compare(labelled, want, got, float("inf"))))
    bad = [e for cp in live for e in cp.errors if not e.ok]
    if bad:
        detail = "; ".join(failure(e) for e in bad)
        raise CheckError(f"{shown or artifact}: tract disagrees with {against} — {detail}", bad)
    return Outcome(checked, originals, actual[0] if actual else [])


def failure(e: OutputError) -> str:
    """One failing output in words: its error, and what the float64 judge found (if it ran)."""
    return f"{e.name}: max abs {e.max_abs:.3g} > {e.tolerance:.3g}" + (f" ({e.note})" if e.note else "")


def _untied(
    errors: list[OutputError],
    inputs: Sequence[torch.Tensor],
    want: Sequence[np.ndarray],
    got: Sequence[np.ndarray],
    reference: Reference,
) -> list[OutputError]:
    """The outputs off beyond tolerance at one point, passed where tied values explain them."""
    try:
        rankings, outputs = ties.record(reference, inputs)
    except Exception:  # the reference ran there a moment ago; a recorder it rejects explains nothing
        return errors
    if not any(rankings) or not reproduces(outputs, want):  # not a function of its inputs: no ties
        return errors
    order = ties.tract_order(rankings, want, got)
    if order:  # the model run again with tract's order of the tied values: compared plainly
        try:
            again = compare([e.name for e in errors], ties.replay(reference, inputs, order), got, 0.0)
        except Exception:
            again = []
        ops = ", ".join(sorted({r.op for k, r in enumerate(rankings) if k in order and r is not None}))
        note = f"equal with tract's order of tied values ({ops}): PyTorch run again in that order"
        errors = [
            replace(e, tied=True, note=note) if not e.ok and a.max_abs <= e.tolerance else e
            for e, a in zip(errors, again or errors, strict=True)
        ]
    return [e if e.ok else ties.untie(e, w, g, rankings) for e, w, g in zip(errors, want, got, strict=True)]


def _judged(
    errors: list[OutputError],
    inputs: Sequence[torch.Tensor],
    want: Sequence[np.ndarray],
    got: Sequence[np.ndarray],
    wide: float64.Reference,
) -> list[OutputError]:
    """The outputs off beyond tolerance at one point, judged against float64 PyTorch there."""
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            same, exact = wide([t.clone() for t in inputs])
    except Exception as exc:
        why = (
            f"float64 PyTorch cannot run the model ({type(exc).__name__}: {_first_line(exc)}),"
            " so this point is judged against torch-f32 alone"
        )
        return [e if e.ok else replace(e, note=why) for e in errors]
    if not reproduces([t.detach().numpy() for t in same], want):
        why = (
            "a copy of the model gives other float32 outputs here (state or randomness): no float64 judgement"
        )
        return [e if e.ok else replace(e, note=why) for e in errors]
    if len(exact) != len(want):
        return [e if e.ok else replace(e, note="float64 PyTorch returns other outputs") for e in errors]
    return [
        e if e.ok or w.dtype.kind != "f" else judge(e, w, x.detach().numpy(), g)
        for e, w, x, g in zip(errors, want, exact, got, strict=True)
    ]


def same_specials(want: np.ndarray, got: np.ndarray) -> bool:
    """NaN and infinities at the same positions (the same infinity), or not a float output."""
    if want.dtype.kind != "f" or got.dtype.kind != "f" or want.shape != got.shape:
        return True
    odd = ~np.isfinite(want) | ~np.isfinite(got)
    return bool(np.array_equal(np.where(odd, want, 0.0), np.where(odd, got, 0.0), equal_nan=True))


def reproduces(outputs: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> bool:
    """``outputs`` are ``want`` bit for bit (NaN where NaN): the model ran as a function."""
    return len(outputs) == len(want) and all(
        o.shape == w.shape and o.dtype == w.dtype and np.array_equal(o, w, equal_nan=o.dtype.kind in "fc")
        for o, w in zip(outputs, want, strict=True)
    )


def _all_finite(a: np.ndarray) -> bool:
    return bool(np.isfinite(a).all()) if a.dtype.kind in "fc" else True


def _eager(reference: Reference, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The reference on copies of ``inputs`` (a model writing into its input must not leak)."""
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        return reference([t.clone() for t in inputs])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:200] if text else repr(exc)


def _name_input_set(text: str, labels: Sequence[str]) -> str:
    """tract's "input set 2: …" as "at random 2 (seed …): …"."""
    for k, label in enumerate(labels):
        text = text.replace(f"input set {k}:", f"at {label}:")
    return text

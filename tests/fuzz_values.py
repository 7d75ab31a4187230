"""Fuzzing value dependence: random op chains with a branch, ``.item()`` or a loop count inserted.

Each case is a random DAG from the op catalogue (``fuzz_models.cases``) whose first output then
goes through one construct that takes a Python value from a tensor — a branch on its sum, a
scale from ``.item()`` / ``float()``, a loop count from ``int()``, ``.tolist()``, ``bool(any)`` —
or, as controls that must still verify, a value taken from a weight or a size. Every case is
exported with the default check (example + random points) through each front end; it must end
in a typed error or a verified artifact, and a verified artifact must then agree with PyTorch
on ``FRESH`` further inputs (wider and sign-flipped draws). An artifact verified but wrong there
is ``silent`` — the failure this mode exists to find.
"""

from __future__ import annotations

import copy
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from hypothesis import assume
from hypothesis import strategies as st
from torch import nn

import torchlower
from tests.fuzz_harness import noise, run_float64
from tests.fuzz_models import Case, CaseModule, cases
from tests.fuzz_spec import Draw
from torchlower.core.comparison import NOISE_FACTOR, compare
from torchlower.errors import CheckError, TorchlowerError
from torchlower.nnef.tract import run_points_in_tract
from torchlower.pipeline.verification import like

FRONTENDS = ("jit", "fx", "export")
KINDS_OF_CONSTRUCT = ("branch", "item", "float", "loop", "tolist", "any", "weight_item", "size_int")
CONTROLS = ("weight_item", "size_int")  # not value-dependent: these should verify
FRESH = 8


@dataclass(frozen=True)
class ValueCase:
    case: Case
    kind: str
    offset: float  # where the branch threshold sits relative to the example's statistic

    def describe(self) -> str:
        return f"{self.case.describe()}\nthen output 0 through {self.kind!r} (offset {self.offset})"


class ValueModel(nn.Module):
    """The case, then the construct on its first output; ``forward`` has named inputs (FX)."""

    _classes: ClassVar[dict[int, type[ValueModel]]] = {}

    def __init__(self, vc: ValueCase) -> None:
        super().__init__()
        self.body = CaseModule(vc.case)
        self.kind = vc.kind
        self.compute = torch.float32  # the construct's dtype; float64 for the judge's reference
        self.register_buffer("scale", torch.tensor([0.5, 1.5]))
        with torch.no_grad():
            first = self.body(*vc.case.inputs)[0].float()
        self.threshold = float(first.sum()) + vc.offset

    @classmethod
    def of(cls, vc: ValueCase) -> ValueModel:
        n = len(vc.case.inputs)
        if n not in cls._classes:
            names = ", ".join(f"x{i}" for i in range(n))
            scope: dict[str, Any] = {}
            exec(f"def forward(self, {names}):\n    return self.run(({names},))", scope)
            cls._classes[n] = type(f"ValueModel{n}", (cls,), {"forward": scope["forward"]})
        return cls._classes[n](vc)

    def run(self, xs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        outs = list(self.body(*xs))
        y = outs[0].to(self.compute)
        if self.kind == "branch":
            y = y * 2 if y.sum() > self.threshold else -y
        elif self.kind == "item":
            y = y * y.mean().item()
        elif self.kind == "float":
            y = y / (float(y.abs().max()) + 1.0)
        elif self.kind == "loop":
            for _ in range(int(y.abs().sum()) % 3 + 1):
                y = y + 1
        elif self.kind == "tolist":
            y = y + y.reshape(-1)[0].tolist()
        elif self.kind == "any":
            if bool((y > self.threshold / max(1, y.numel())).any()):
                y = y.relu()
        elif self.kind == "weight_item":
            y = y * self.scale.sum().item()
        elif self.kind == "size_int":
            y = y * int(torch.tensor(y.shape).prod()) if y.dim() else y * 2
        outs[0] = y
        return tuple(outs)


@st.composite
def value_cases(draw: Draw, max_ops: int = 4) -> ValueCase:
    kind = draw(st.sampled_from(KINDS_OF_CONSTRUCT))
    offset = draw(st.sampled_from([-1e6, -10.0, -0.5, 0.5, 10.0, 1e6]))
    vc = ValueCase(draw(cases(max_ops)), kind, offset)
    try:  # a case PyTorch itself cannot run (int(nan) in a loop count) is not a case
        with torch.no_grad():
            ValueModel.of(vc)(*vc.case.inputs)
    except (RuntimeError, ValueError, OverflowError):
        assume(False)
    return vc


def fresh_inputs(example: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, ...]]:
    """Inputs beyond the export's own check: other seeds, 3× wider, sign-flipped."""
    out = []
    for k in range(FRESH):
        g = torch.Generator().manual_seed(7000 + k)
        drawn = tuple(like(t, g) for t in example)
        if k % 2:
            drawn = tuple(t * 3 if t.is_floating_point() else t for t in drawn)
        if k % 4 >= 2:
            drawn = tuple(-t if t.is_floating_point() else t for t in drawn)
        out.append(drawn)
    return out


@dataclass(frozen=True)
class Outcome:
    frontend: str
    status: str  # verified | noise (within float32 noise) | nan (see judge) | typed | refused | silent | raw
    detail: str = ""


OK = ("verified", "noise", "nan", "typed", "refused")


class ValueRunner:
    def __init__(self, frontends: tuple[str, ...] = FRONTENDS) -> None:
        self.frontends = frontends
        self.counts: Counter[str] = Counter()
        self.by_kind: Counter[tuple[str, str]] = Counter()
        self.typed: Counter[str] = Counter()
        self.failures: list[tuple[Outcome, ValueCase]] = []
        self.noted: list[tuple[Outcome, ValueCase]] = []  # refused by the check, or within noise only

    def run(self, vc: ValueCase) -> list[Outcome]:
        outcomes = []
        with tempfile.TemporaryDirectory(prefix="tl-fuzzv-") as tmp:
            for fe in self.frontends:
                outcomes.append(self._one(vc, fe, Path(tmp) / f"{fe}.nnef"))
        for o in outcomes:
            self.counts[o.status] += 1
            self.by_kind[(vc.kind, o.status)] += 1
            if o.status == "typed":
                self.typed[o.detail.split(":")[0]] += 1
            if o.status not in OK:
                self.failures.append((o, vc))
            elif o.status in ("refused", "noise", "nan"):
                self.noted.append((o, vc))
        return outcomes

    def _one(self, vc: ValueCase, fe: str, path: Path) -> Outcome:
        model = ValueModel.of(vc).eval()
        example = tuple(vc.case.inputs)
        try:
            torchlower.export(model, example, path, frontend=fe)
        except CheckError as exc:
            return Outcome(fe, "refused", f"CheckError: {exc}")
        except TorchlowerError as exc:
            return Outcome(fe, "typed", f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a raw exception escaping torchlower is a bug
            return Outcome(fe, "raw", f"{type(exc).__name__}: {exc}")
        return self._fresh(model, example, path, fe)

    def _fresh(self, model: ValueModel, example: tuple[torch.Tensor, ...], path: Path, fe: str) -> Outcome:
        """A verified artifact, run at fresh inputs: a disagreement beyond float32 noise is a silent wrong.

        Ill-conditioned programs (``tan(acos(x))`` near pi/2) move by float32 rounding alone, in
        torch as in tract; so each fresh point is also evaluated in float64, and an output is
        wrong only when tract is off torch's float32 answer by more than the plain tolerance
        *and* off the float64 answer by more than four times torch's own float32 error. An
        output that passes only by that allowance is counted (``noise``) and listed.
        """
        points, wants, exacts = [], [], []
        wide = copy.deepcopy(model)
        wide.compute = torch.float64
        for xs in fresh_inputs(example):
            try:
                with torch.no_grad():
                    wants.append([t.float().numpy() for t in model(*[x.clone() for x in xs])])
            except Exception:
                continue  # PyTorch refuses that input: nothing to compare
            exacts.append(run_float64(wide, xs))
            points.append([x.numpy() for x in xs])
        if not points:
            return Outcome(fe, "verified")
        try:
            got = run_points_in_tract(path, points)
        except CheckError as exc:
            return Outcome(fe, "silent", f"verified, then tract failed at a fresh input: {exc}")
        found: dict[str, str] = {}  # status -> first detail; silent > nan > noise > verified
        for want, exact, have in zip(wants, exacts, got, strict=True):
            for k, (w, h) in enumerate(zip(want, have, strict=True)):
                status, detail = judge(k, w, None if exact is None else exact[k], h)
                if status == "silent":
                    return Outcome(fe, status, detail)
                found.setdefault(status, detail)
        status = next((s for s in ("nan", "noise") if s in found), "verified")
        return Outcome(fe, status, found.get(status, ""))


def judge(k: int, want: np.ndarray, exact: np.ndarray | None, have: np.ndarray) -> tuple[str, str]:
    """Output ``k`` at one point: torch float32 ``want``, torch float64 ``exact``, tract ``have``.

    ``verified`` within 1e-3 of the output's magnitude of torch's float32 answer; else ``noise``
    when tract is within that plus 4 × |torch float32 − float64| of the float64 answer (float32
    rounding moves this program that much in torch too); ``nan`` when tract differs only where
    torch gives NaN (``_only_where_torch_is_nan``); else ``silent``.
    """
    if want.shape != have.shape:
        return "silent", f"output {k}: shape {have.shape} != {want.shape} at a fresh input"
    have = have.astype(np.float32)
    tol = 1e-3 * _scale(want)
    plain = compare([f"out{k}"], [want], [have], tol)[0]
    if plain.ok:
        return "verified", ""
    e = None if exact is None else exact.astype(np.float64)
    f32 = noise(want, e)
    judged = compare([f"out{k}"], [e], [have], tol + NOISE_FACTOR * f32)[0] if e is not None else plain
    if not judged.ok:
        if _only_where_torch_is_nan(want, have, tol):
            return "nan", f"output {k}: tract gives numbers only where torch float32 gives NaN"
        return "silent", (
            f"output {k}: max abs {plain.max_abs:.3g} vs torch float32 at a fresh input"
            f" ({judged.max_abs:.3g} vs float64, where torch float32 is {f32:.3g} off)"
        )
    return "noise", (
        f"output {k}: tract {plain.max_abs:.3g} off torch float32, {judged.max_abs:.3g} off"
        f" float64; torch float32 itself {f32:.3g} off float64"
    )


def _only_where_torch_is_nan(want: np.ndarray, have: np.ndarray, tol: float) -> bool:
    """Every element off by more than ``tol`` is one where torch gives NaN and tract a number.

    A fresh input outside the model's domain (log of a negative, cos of an overflowed cosh)
    makes a NaN that a later clamp / max / min / tanh drops in tract (which returns the other
    operand, a documented difference: docs/reliability.md) but propagates in torch. The export
    check skips such points for the same reason; here they are counted apart, not as wrong.
    """
    w, h = want.astype(np.float64), have.astype(np.float64)
    same = (np.isnan(w) & np.isnan(h)) | (w == h) | (np.abs(w - h) <= tol)
    return bool(np.all(same | np.isnan(w)))


def _scale(w: np.ndarray) -> float:
    finite = w[np.isfinite(w)]
    return max(1.0, float(np.abs(finite).max())) if finite.size else 1.0

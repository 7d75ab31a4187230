"""Fuzzing special values: random op chains fed NaN, ±inf, ±0, the extreme normals and denormals.

Each case of the op catalogue (``fuzz_models.cases``, drawn on ordinary inputs so only valid
calls are kept) is run again with some positions of every float input replaced by values of
``CATALOGUE`` (positions and values drawn per case, independent of the check's own
special-values point). tract's outputs there are judged against PyTorch's position by position:
NaN where torch has NaN, the same infinity, integers and bools equal, finite floats within the
fuzz tolerance of the *ordinary* inputs' output scale (an element beyond it measured relative
to itself, as the check's special point does) widened by float32's own noise (float64 torch).

Outcomes per (case, front end):

- ``verified``: equal position by position;
- ``typed``: refused at export with a typed error;
- ``check``: differs, and exporting that case alone with ``check="special"`` refuses it (the
  user who asks for special values is told);
- ``silent``: differs and the strict check passes it — the failure this mode exists to find;
- ``noise``: differs, but tract's outputs are torch's *float64* answer position by position
  (torch's float32 kernel overflowed where the exact value is a number: ``group_norm`` of a
  3.4e38 is NaN in torch-f32, its bias in float64 and tract), or some step of the chain is
  ill-conditioned at that input (torch float32 and float64 disagree there beyond 1e-3 relative,
  or float32 is NaN / inf where float64 is a number: ``3.4e38 - 3.4e38 + …`` in a sum, whose
  answer depends on the order of the additions; torch's folded ``group_norm`` of 3.4e38, NaN in
  float32 and -5e23 in float64 where the exact answer — tract's — is the bias); listed for
  triage, not a failure;
- ``torch``: PyTorch itself fails at the special input (skipped); ``tract`` / ``raw`` as in
  ``fuzz_harness``.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from hypothesis import strategies as st

import torchlower
from tests.fuzz_catalogue import BY_NAME
from tests.fuzz_harness import Outcome, _export, noise, run_float64, run_tract
from tests.fuzz_models import BatchModel, Case, CaseModule, cases, run_case
from tests.fuzz_spec import Draw
from torchlower.errors import CheckError, TorchlowerError

FRONTENDS = ("jit", "fx", "export")
_INFO = torch.finfo(torch.float32)
_DENORMAL = _INFO.smallest_normal * _INFO.eps
CATALOGUE = (float("nan"), float("inf"), float("-inf"), -0.0, 0.0, _INFO.max, -_INFO.max,
             _INFO.smallest_normal, -_INFO.smallest_normal, _DENORMAL, -_DENORMAL, 7 * _DENORMAL)  # fmt: skip
OK = ("verified", "typed", "check", "noise", "torch")
Wanted = tuple[list[np.ndarray], float, list[float], "list[np.ndarray] | None"]


@dataclass(frozen=True)
class SpecialCase:
    case: Case
    inputs: tuple[torch.Tensor, ...]  # the case's inputs with special values placed

    def describe(self) -> str:
        placed = [
            f"input {k}: {t.reshape(-1).tolist()}"
            for k, (t, o) in enumerate(zip(self.inputs, self.case.inputs, strict=True))
            if not torch.equal(t, o)
        ]
        return "\n".join([self.case.describe(), "special inputs:", *placed])


def placed(draw: Draw, t: torch.Tensor) -> torch.Tensor:
    """``t`` with 1..4 of its positions (all of a small tensor at most) set to catalogue values."""
    if not t.is_floating_point() or t.numel() == 0:
        return t
    flat = t.clone().reshape(-1)
    count = draw(st.integers(1, min(4, flat.numel())))
    where = draw(st.lists(st.integers(0, flat.numel() - 1), min_size=count, max_size=count, unique=True))
    for k in where:
        flat[k] = draw(st.sampled_from(CATALOGUE))
    return flat.reshape(t.shape)


@st.composite
def special_batches(draw: Draw, size: int, max_ops: int = 5) -> list[SpecialCase]:
    out = []
    for _ in range(size):
        case = draw(cases(max_ops))
        out.append(SpecialCase(case, tuple(placed(draw, t) for t in case.inputs)))
    return out


def _outputs(case: Case, inputs: tuple[torch.Tensor, ...]) -> list[np.ndarray]:
    with torch.no_grad():
        return [t.numpy() for t in run_case(case, tuple(t.clone() for t in inputs), case.weights)]


def _steps(case: Case, inputs: tuple[torch.Tensor, ...], wide: bool) -> list[torch.Tensor]:
    """Every value of the case (inputs and op results), in float64 when ``wide``."""
    env: list[torch.Tensor] = []
    it = iter(t.double() if wide and t.is_floating_point() else t.clone() for t in inputs)
    weights = [w.double() if wide and w.is_floating_point() else w for w in case.weights]
    for ev in case.events:
        if ev is None:
            env.append(next(it))
        else:
            op = BY_NAME[ev.op]
            env.append(op.fn(*(env[i] for i in ev.inputs), *(weights[k] for k in ev.weights), **ev.params))
    return env


def ill_conditioned(case: Case, inputs: tuple[torch.Tensor, ...]) -> bool:
    """Whether float32 rounding alone moves some step of ``case`` at ``inputs`` (float32 and
    float64 torch differ beyond 1e-3 relative where both are finite)."""
    default = torch.get_default_dtype()
    try:
        with torch.no_grad():
            narrow = _steps(case, inputs, False)
            torch.set_default_dtype(torch.float64)
            wide = _steps(case, inputs, True)
    except Exception:
        return False
    finally:
        torch.set_default_dtype(default)
    for n, w in zip(narrow, wide, strict=True):
        if not n.is_floating_point() or not w.is_floating_point() or n.shape != w.shape:
            continue
        a, e = n.double(), w.double()
        both = torch.isfinite(a) & torch.isfinite(e)
        if bool(((a - e).abs() > 1e-3 * e.abs().clamp_min(1.0))[both].any()):
            return True
        if bool((~torch.isfinite(a) & torch.isfinite(e)).any()):  # float32 overflowed where float64 did not
            return True
    return False


def differs(want: np.ndarray, got: np.ndarray, scale: float, f32_noise: float) -> str | None:
    """Why tract's ``got`` is not torch's ``want`` position by position, or None."""
    if want.shape != got.shape:
        return f"shape {got.shape} != {want.shape}"
    if want.dtype.kind != "f" or got.dtype.kind != "f":
        if want.dtype.kind == "f" or got.dtype.kind == "f" or not np.array_equal(want, got):
            return (
                f"{got.dtype} {got.reshape(-1)[:8].tolist()} != {want.dtype} {want.reshape(-1)[:8].tolist()}"
            )
        return None
    w, g = want.astype(np.float64), got.astype(np.float64)
    if not np.array_equal(np.isnan(w), np.isnan(g)):
        k = int(np.argmax(np.isnan(w) != np.isnan(g)))
        return f"NaN at {k}: tract {g.reshape(-1)[k]}, torch {w.reshape(-1)[k]}"
    inf = np.isinf(w) | np.isinf(g)
    if not np.array_equal(np.where(inf, w, 0), np.where(inf, g, 0)):
        k = int(np.argmax((np.where(inf, w, 0) != np.where(inf, g, 0)).reshape(-1)))
        return f"infinity at {k}: tract {g.reshape(-1)[k]}, torch {w.reshape(-1)[k]}"
    finite = ~(np.isnan(w) | inf)
    diff = np.abs(w - g)[finite]
    big = np.abs(w[finite])
    diff = np.where(big > scale, diff * scale / np.maximum(big, 1e-300), diff)
    limit = 1e-4 * max(1.0, scale) + 4 * f32_noise
    if diff.size and float(diff.max()) > limit:
        return f"max abs {float(diff.max()):.3g} > {limit:.3g}"
    return None


def _is_float64(exact: list[np.ndarray], got: list[np.ndarray], scale: float) -> bool:
    """tract's outputs equal torch-float64's, rounded to float32, position by position."""
    narrowed = [e.astype(np.float32) if e.dtype == np.float64 else e for e in exact]
    return len(narrowed) == len(got) and all(
        differs(e, g, scale, 0.0) is None for e, g in zip(narrowed, got, strict=True)
    )


class SpecialRunner:
    """Batches of special cases: one export per front end (check off), one tract run at the
    special inputs; each differing case exported alone with ``check="special"``."""

    def __init__(self, frontends: tuple[str, ...] = FRONTENDS) -> None:
        self.frontends = frontends
        self.counts: Counter[str] = Counter()
        self.per_frontend: Counter[tuple[str, str]] = Counter()
        self.typed: Counter[str] = Counter()
        self.failures: list[tuple[Outcome, SpecialCase]] = []
        self.refused: list[tuple[Outcome, SpecialCase]] = []  # differences the strict check refused

    def run(self, batch: list[SpecialCase]) -> list[Outcome]:
        with tempfile.TemporaryDirectory(prefix="tl-fuzz-special-") as tmp:
            outcomes = self._run(batch, Path(tmp))
        for o in outcomes:
            self.counts[o.status] += 1
            self.per_frontend[(o.frontend, o.status)] += 1
            if o.status == "typed":
                self.typed[o.detail.split(":")[0]] += 1
            elif o.status in ("check", "noise"):
                self.refused.append((o, batch[o.case]))
            elif o.status not in OK:
                self.failures.append((o, batch[o.case]))
        return outcomes

    def _run(self, batch: list[SpecialCase], tmp: Path) -> list[Outcome]:
        outcomes: list[Outcome] = []
        wanted: dict[int, Wanted] = {}
        for i, sc in enumerate(batch):
            try:
                want = _outputs(sc.case, sc.inputs)
            except Exception as exc:
                outcomes += [Outcome(i, fe, "torch", f"{type(exc).__name__}: {exc}") for fe in self.frontends]
                continue
            base = _outputs(sc.case, tuple(sc.case.inputs))
            finite = [np.abs(b[np.isfinite(b)]) if b.dtype.kind == "f" else np.abs(b) for b in base]
            scale = max([1.0] + [float(f.max()) for f in finite if f.size])
            exact = run_float64(CaseModule(sc.case), sc.inputs)
            noises = [noise(w, e) for w, e in zip(want, exact or [None] * len(want), strict=True)]
            wanted[i] = (want, scale, noises, exact)
        live = [i for i in range(len(batch)) if i in wanted]
        if not live:
            return outcomes
        jobs: list[tuple[Path, list[int], str]] = []
        for fe in self.frontends:
            try:
                jobs.append((_export([batch[i].case for i in live], fe, tmp / f"{fe}.nnef"), live, fe))
                continue
            except Exception:
                pass
            for i in live:
                try:
                    jobs.append((_export([batch[i].case], fe, tmp / f"{fe}-{i}.nnef"), [i], fe))
                except TorchlowerError as exc:
                    outcomes.append(Outcome(i, fe, "typed", f"{type(exc).__name__}: {exc}"))
                except Exception as exc:
                    outcomes.append(Outcome(i, fe, "raw", f"{type(exc).__name__}: {exc}"))
        inputs = [tuple(t for i in idx for t in batch[i].inputs) for _, idx, _ in jobs]
        results = run_tract([(art, xs) for (art, _, _), xs in zip(jobs, inputs, strict=True)], tmp)
        for (_, idx, fe), got in zip(jobs, results, strict=True):
            outcomes += self._judge(batch, idx, fe, got, wanted, tmp)
        return outcomes

    def _judge(
        self,
        batch: list[SpecialCase],
        idx: list[int],
        fe: str,
        got: list[np.ndarray] | str,
        wanted: dict[int, Wanted],
        tmp: Path,
    ) -> list[Outcome]:
        if isinstance(got, str):
            if len(idx) == 1:
                return [self._confirm(batch[idx[0]], idx[0], fe, f"tract fails: {got[:300]}", tmp)]
            out = []
            for i in idx:
                art = _export([batch[i].case], fe, tmp / f"{fe}-s{i}.nnef")
                (one,) = run_tract([(art, batch[i].inputs)], tmp)
                out += self._judge(batch, [i], fe, one, wanted, tmp)
            return out
        outcomes, start = [], 0
        for i in idx:
            want, scale, noises, exact = wanted[i]
            mine = got[start : start + len(want)]
            start += len(want)
            why = next(
                (
                    f"output {k}: {d}"
                    for k, (w, g, n) in enumerate(zip(want, mine, noises, strict=True))
                    if (d := differs(w, g, scale, n)) is not None
                ),
                None,
            )
            if why is not None and exact is not None and _is_float64(exact, mine, scale):
                outcomes.append(Outcome(i, fe, "noise", f"{why} (tract is torch's float64 answer)"))
                continue
            outcomes.append(
                Outcome(i, fe, "verified") if why is None else self._confirm(batch[i], i, fe, why, tmp)
            )
        return outcomes

    def _confirm(self, sc: SpecialCase, i: int, fe: str, why: str, tmp: Path) -> Outcome:
        """A differing case alone, exported with ``check="special"``: refused, or silent."""
        if ill_conditioned(sc.case, sc.inputs):
            return Outcome(i, fe, "noise", why)
        model = BatchModel.of([sc.case]).eval()
        try:
            torchlower.export(
                model, tuple(sc.case.inputs), tmp / f"{fe}-c{i}.nnef", frontend=fe, check="special"
            )
        except CheckError as exc:
            return Outcome(i, fe, "check", f"{why} [check: {str(exc)[-300:]}]")
        except TorchlowerError as exc:
            return Outcome(i, fe, "typed", f"{type(exc).__name__}: {exc}")
        except Exception as exc:
            return Outcome(i, fe, "raw", f"{type(exc).__name__}: {exc}")
        return Outcome(i, fe, "silent", why)

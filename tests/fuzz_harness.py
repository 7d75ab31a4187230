"""Run generated cases through torchlower and tract; classify every (case, front end).

A batch of cases becomes one model per front end (one export, one tract run). When the batch
export fails, each case is exported alone to attribute the error; the cases that export are
batched again. All artifacts of a batch run in one tract child process; if it aborts, the
artifacts run one by one, then the cases of a failing artifact one by one.

Outcomes: ``verified``; ``typed`` (a ``TorchlowerError`` other than ``CheckError`` at export);
``mismatch`` (exported, tract disagrees); ``tract`` (exported, tract cannot run it); ``raw`` (a
non-torchlower exception). Only the first two are acceptable.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

import torchlower
from tests.fuzz_models import BatchModel, Case, batch_inputs, output_owner
from torchlower.core.comparison import compare, float32_noise
from torchlower.errors import CheckError, TorchlowerError
from torchlower.pipeline.export import FRONTENDS

OK = ("verified", "typed")
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Outcome:
    case: int
    frontend: str
    status: str  # verified | typed | mismatch | tract | raw
    detail: str = ""


def tolerance(want: np.ndarray) -> float:
    """Per output: 1e-4 relative to its largest finite magnitude (absolute 1e-4 at least)."""
    finite = want[np.isfinite(want)] if want.dtype.kind == "f" else want
    scale = float(np.abs(finite).max()) if finite.size else 1.0
    return 1e-4 * max(1.0, scale)


_CHILD = """
import sys, numpy as np, tract
nnef = tract.nnef().with_tract_extra().with_tract_transformers()
for job in sys.argv[1:]:
    art, ins, outs = job.split("|")
    with np.load(ins) as d:
        xs = [d[f"arr_{i}"] for i in range(len(d.files))]
    try:
        ys = [t.to_numpy() for t in nnef.load(art).into_runnable().run(xs)]
        np.savez(outs, *ys)
    except Exception as e:
        open(outs + ".err", "w").write(str(e).split("Stack backtrace")[0][-3000:])
"""


def run_tract(jobs: list[tuple[Path, tuple[torch.Tensor, ...]]], tmp: Path) -> list[list[np.ndarray] | str]:
    """Outputs per job, or the error text; one child process for all (re-run alone after an abort)."""
    tmp = Path(tempfile.mkdtemp(dir=tmp))
    args = []
    for i, (art, xs) in enumerate(jobs):
        np.savez(tmp / f"in{i}.npz", *[x.numpy() for x in xs])
        args.append(f"{art}|{tmp / f'in{i}.npz'}|{tmp / f'out{i}.npz'}")
    env = dict(os.environ, RAYON_NUM_THREADS="1")
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, *args], capture_output=True, text=True, env=env, cwd=ROOT
    )
    if proc.returncode != 0 and len(jobs) > 1:
        return [r for job in jobs for r in run_tract([job], tmp)]
    if proc.returncode != 0:
        return [f"tract aborted (status {proc.returncode}): {proc.stderr.strip()[-1500:]}"]
    results: list[list[np.ndarray] | str] = []
    for i in range(len(jobs)):
        err = tmp / f"out{i}.npz.err"
        if err.exists():
            results.append(err.read_text())
            continue
        with np.load(tmp / f"out{i}.npz") as d:
            results.append([d[f"arr_{k}"] for k in range(len(d.files))])
    return results


def _export(cases: list[Case], frontend: str, path: Path) -> Path:
    model = BatchModel.of(cases).eval()
    return torchlower.export(model, batch_inputs(cases), path, frontend=frontend, check=False).path


def _expected(cases: list[Case]) -> list[np.ndarray]:
    with torch.no_grad():
        return [t.numpy() for t in BatchModel.of(cases).eval()(*batch_inputs(cases))]


def run_float64(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> list[np.ndarray] | None:
    """``module`` evaluated in float64 (a copy; float inputs widened), or None if it cannot be.

    The reference a float32 result is measured against: how far torch's own float32 answer is
    from it is what float32 rounding alone does to that program (``f32_noise``).
    """
    wide = tuple(t.double() if t.is_floating_point() else t for t in inputs)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)  # ``int_tensor - 2.968`` is float64 too
    try:
        with torch.no_grad():
            return [t.numpy() for t in copy.deepcopy(module).double().eval()(*wide)]
    except Exception:  # a program with an explicit float32 step does not run in float64
        return None
    finally:
        torch.set_default_dtype(default)


def noise(want: np.ndarray, exact: np.ndarray | None) -> float:
    """max |float32 − float64| over the elements finite in both (0 where not comparable); the
    export check's float64 judge uses the same measure (``torchlower.core.comparison``)."""
    return float32_noise(want, exact)


def f32_noise(cases: list[Case], want: list[np.ndarray]) -> list[float]:
    """Per output: how far torch's own float32 result is from float64 (0 where not comparable).

    A program can be ill-conditioned (``sin`` of an ``expm1`` in the millions): then float32
    rounding alone moves the result, in torch as in tract, by about this much.
    """
    exact = run_float64(BatchModel.of(cases), batch_inputs(cases))
    if exact is None:
        return [0.0] * len(want)
    return [noise(w, e) for w, e in zip(want, exact, strict=True)]


class Runner:
    """Runs batches; ``counts`` accumulates outcomes, ``failures`` keeps the bad ones with their case."""

    def __init__(self, frontends: tuple[str, ...] = FRONTENDS) -> None:
        self.frontends = frontends
        self.counts: Counter[str] = Counter()
        self.per_frontend: Counter[tuple[str, str]] = Counter()
        self.typed: Counter[str] = Counter()
        self.failures: list[tuple[Outcome, Case]] = []
        self.fail_rate: Counter[str] = Counter()  # recent share of batches whose export failed
        self.batches = 0

    def run(self, cases: list[Case]) -> list[Outcome]:
        with tempfile.TemporaryDirectory(prefix="tl-fuzz-") as tmp:
            outcomes = self._run(cases, Path(tmp))
        for o in outcomes:
            self.counts[o.status] += 1
            self.per_frontend[(o.frontend, o.status)] += 1
            if o.status == "typed":
                self.typed[o.detail.split(":")[0]] += 1
            elif o.status not in OK:
                self.failures.append((o, cases[o.case]))
        return outcomes

    def _run(self, cases: list[Case], tmp: Path) -> list[Outcome]:
        outcomes: list[Outcome] = []
        jobs: list[tuple[Path, list[int], str]] = []  # artifact, case indices, front end
        self.batches += 1
        for fe in self.frontends:
            # a batch that fails costs an export for nothing: where most do, export case by case
            if self.fail_rate[fe] < 0.5 or self.batches % 5 == 0:
                try:
                    jobs.append((_export(cases, fe, tmp / f"{fe}.nnef"), list(range(len(cases))), fe))
                    self.fail_rate[fe] *= 0.8
                    continue
                except Exception:  # attribute the failure case by case below
                    self.fail_rate[fe] = 0.8 * self.fail_rate[fe] + 0.2
            for i, case in enumerate(cases):
                try:
                    jobs.append((_export([case], fe, tmp / f"{fe}-{i}.nnef"), [i], fe))
                except CheckError as exc:
                    outcomes.append(Outcome(i, fe, "raw", f"CheckError at export: {exc}"))
                except TorchlowerError as exc:
                    outcomes.append(Outcome(i, fe, "typed", f"{type(exc).__name__}: {exc}"))
                except Exception as exc:  # a raw exception escaping torchlower is a bug
                    outcomes.append(Outcome(i, fe, "raw", f"{type(exc).__name__}: {exc}"))
        results = run_tract([(art, batch_inputs([cases[i] for i in idx])) for art, idx, _ in jobs], tmp)
        for (art, idx, fe), got in zip(jobs, results, strict=True):
            outcomes.extend(self._judge([cases[i] for i in idx], idx, fe, got, art, tmp))
        return outcomes

    def _judge(
        self, cases: list[Case], idx: list[int], fe: str, got: list[np.ndarray] | str, art: Path, tmp: Path
    ) -> list[Outcome]:
        if isinstance(got, str):
            if len(cases) > 1:  # find which case tract cannot run
                pairs = zip(idx, cases, strict=True)
                singles = [(_export([c], fe, tmp / f"{fe}-s{i}.nnef"), (c,)) for i, c in pairs]
                res = run_tract([(a, batch_inputs(list(c))) for a, c in singles], tmp)
                return [
                    o
                    for (a, c), r, i in zip(singles, res, idx, strict=True)
                    for o in self._judge(list(c), [i], fe, r, a, tmp)
                ]
            return [Outcome(idx[0], fe, "tract", got)]
        want = _expected(cases)
        noise = f32_noise(cases, want)
        owner = output_owner(cases)
        bad: dict[int, str] = {}
        if len(got) != len(want):
            return [Outcome(i, fe, "mismatch", f"{len(got)} outputs, expected {len(want)}") for i in idx]
        for k, (w, g) in enumerate(zip(want, got, strict=True)):
            if w.shape != g.shape:
                bad[owner[k]] = f"output {k}: shape {g.shape} != {w.shape}"
                continue
            err = compare([f"out{k}"], [w], [g], tolerance(w) + 4 * noise[k])[0]
            if not err.ok or (w.dtype != g.dtype and w.dtype.kind != g.dtype.kind):
                bad.setdefault(
                    owner[k],
                    f"output {k}: max abs {err.max_abs:.3g} > {err.tolerance:.3g} "
                    f"(torch {w.dtype}, tract {g.dtype})",
                )
        return [
            Outcome(i, fe, "mismatch", bad[j]) if j in bad else Outcome(i, fe, "verified")
            for j, i in enumerate(idx)
        ]

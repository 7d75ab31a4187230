"""Checking an artifact: run it in tract (child process) and compare with PyTorch."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from torchlower.errors import CheckError

RUN_TIMEOUT_S = 600


@dataclass(frozen=True)
class OutputError:
    """How far one output of the artifact is from the reference."""

    name: str
    max_abs: float
    max_rel: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_abs <= self.tolerance


def run_in_tract(artifact: str | os.PathLike[str], inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Outputs of the artifact on ``inputs``; a tract failure or abort becomes ``CheckError``."""
    with tempfile.TemporaryDirectory(prefix="torchlower-check-") as tmp:
        ins, outs = Path(tmp, "in.npz"), Path(tmp, "out.npz")
        runnable = Path(artifact).resolve()  # the child runs in another directory
        np.savez(ins, *inputs)
        env = dict(os.environ, RAYON_NUM_THREADS=os.environ.get("RAYON_NUM_THREADS", "1"))
        proc = subprocess.run(
            [sys.executable, "-m", "torchlower.nnef.tract_runner", str(runnable), str(ins), str(outs)],
            capture_output=True,
            text=True,
            env=env,
            timeout=RUN_TIMEOUT_S,
            cwd=Path(__file__).resolve().parents[2],
        )
        if proc.returncode != 0:
            reason = proc.stderr.strip() or f"exit status {proc.returncode}"
            if proc.returncode < 0:
                reason = f"tract aborted the process (signal {-proc.returncode}). {reason[-2000:]}"
            raise CheckError(f"tract could not run {artifact}: {reason[-4000:]}")
        with np.load(outs) as data:
            return [data[f"arr_{i}"] for i in range(len(data.files))]


def compare(
    names: Sequence[str], expected: Sequence[np.ndarray], actual: Sequence[np.ndarray], tolerance: float
) -> list[OutputError]:
    """Per-output max absolute and relative error; shape or count mismatches are errors."""
    if len(expected) != len(actual):
        raise CheckError(f"tract produced {len(actual)} outputs, PyTorch {len(expected)}")
    errors = []
    for name, want, got in zip(names, expected, actual, strict=True):
        if tuple(want.shape) != tuple(got.shape):
            raise CheckError(
                f"output {name!r}: tract shape {tuple(got.shape)} != PyTorch shape {tuple(want.shape)}"
            )
        if want.dtype == np.bool_ or got.dtype == np.bool_:
            want, got = want.astype(np.float64), got.astype(np.float64)
        w, g = want.astype(np.float64), got.astype(np.float64)
        diff = np.abs(w - g)
        both_inf = np.isinf(w) & np.isinf(g) & (np.sign(w) == np.sign(g))
        both_nan = np.isnan(w) & np.isnan(g)
        diff = np.where(both_inf | both_nan, 0.0, diff)
        diff = np.where(np.isnan(diff), np.inf, diff)
        max_abs = float(diff.max()) if diff.size else 0.0
        rel = diff / np.maximum(np.abs(w), 1e-12)
        max_rel = float(rel.max()) if rel.size else 0.0
        errors.append(OutputError(name, max_abs, max_rel, tolerance))
    return errors

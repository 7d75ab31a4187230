"""How far an artifact's outputs are from the reference's: per output, max absolute and relative
error against a tolerance. Every check (tract for NNEF, the reference executor for lattice)
reports in these terms.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from torchlower.errors import CheckError


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

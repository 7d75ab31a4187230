"""How far an artifact's outputs are from the reference's: per output, max absolute and relative
error against a tolerance. Every check (tract for NNEF, the reference executor for lattice)
reports in these terms.

Where float32 rounding alone moves a program (a near-singular 3×3 inverse, a sum that cancels),
torch's own float32 answer is off too: ``judge`` measures both against float64 PyTorch and lets
tract be as far from it as torch-f32's own distance allows (``NOISE_FACTOR`` × that distance
beyond the plain tolerance) — the rule of the fuzz judge (``tests/fuzz_values.py``), shared here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from torchlower.errors import CheckError

NOISE_FACTOR = 4.0  # tract may be this many times torch-f32's own float64 distance further off


@dataclass(frozen=True)
class OutputError:
    """How far one output of the artifact is from the reference.

    ``vs_float64`` / ``float32_off`` are set where the point was judged against float64 PyTorch
    (tract was off torch-f32 beyond ``tolerance``): tract's and torch-f32's own max abs distance
    from the float64 answer. ``note`` says what that judgement (or a tie group) found.
    """

    name: str
    max_abs: float
    max_rel: float
    tolerance: float
    vs_float64: float | None = None
    float32_off: float | None = None
    note: str | None = None
    tied: bool = False  # equal to the reference up to the order of tied values (``ties``)

    @property
    def allowance(self) -> float:
        """How far from float64 tract may be: the tolerance plus float32's own noise."""
        return self.tolerance + NOISE_FACTOR * (self.float32_off or 0.0)

    @property
    def ok(self) -> bool:
        if self.max_abs <= self.tolerance or self.tied:
            return True
        return self.vs_float64 is not None and self.vs_float64 <= self.allowance


def compare(
    names: Sequence[str],
    expected: Sequence[np.ndarray],
    actual: Sequence[np.ndarray],
    tolerance: float,
    scale: float | None = None,
) -> list[OutputError]:
    """Per-output max absolute and relative error; shape or count mismatches are errors.

    ``scale`` (the special-values point): an element larger than ``scale`` has its error
    measured relative to it (× ``scale / |expected|``), so a 3e38 element cannot widen the
    tolerance of the others (it is the example's, not the point's)."""
    if len(expected) != len(actual):
        raise CheckError(f"tract produced {len(actual)} outputs, PyTorch {len(expected)}")
    errors = []
    for name, want, got in zip(names, expected, actual, strict=True):
        if tuple(want.shape) != tuple(got.shape):
            raise CheckError(
                f"output {name!r}: tract shape {tuple(got.shape)} != PyTorch shape {tuple(want.shape)}"
            )
        diff = differences(want, got)
        if scale is not None:
            big = np.abs(want.astype(np.float64))
            diff = np.where(np.isfinite(big) & (big > scale), diff * scale / np.maximum(big, 1e-300), diff)
        max_abs = float(diff.max()) if diff.size else 0.0
        rel = diff / np.maximum(np.abs(want.astype(np.float64)), 1e-12)
        max_rel = float(rel.max()) if rel.size else 0.0
        errors.append(OutputError(name, max_abs, max_rel, tolerance))
    return errors


def differences(want: np.ndarray, got: np.ndarray) -> np.ndarray:
    """|want − got| per element in float64: 0 where both are NaN or the same infinity, inf where
    only one is NaN."""
    w, g = want.astype(np.float64), got.astype(np.float64)
    diff = np.abs(w - g)
    both_inf = np.isinf(w) & np.isinf(g) & (np.sign(w) == np.sign(g))
    both_nan = np.isnan(w) & np.isnan(g)
    diff = np.where(both_inf | both_nan, 0.0, diff)
    return np.where(np.isnan(diff), np.inf, diff)


def float32_noise(want: np.ndarray, exact: np.ndarray | None) -> float:
    """max |float32 − float64| over the elements finite in both (0 where not comparable): what
    float32 rounding alone does to this output at this point."""
    if exact is None or want.dtype.kind != "f" or exact.shape != want.shape:
        return 0.0
    both = np.isfinite(want) & np.isfinite(exact)
    return float(np.abs(want[both].astype(np.float64) - exact[both].astype(np.float64)).max(initial=0.0))


def judge(error: OutputError, want: np.ndarray, exact: np.ndarray, have: np.ndarray) -> OutputError:
    """``error`` (tract ``have`` vs torch-f32 ``want``) judged against float64 PyTorch ``exact``:
    ok when tract is within ``tolerance + NOISE_FACTOR × |torch-f32 − float64|`` of ``exact``,
    never when tract is further off than that (the fuzz judge's rule)."""
    if exact.shape != want.shape or exact.dtype.kind != "f" or want.dtype.kind != "f":
        return replace(error, note="float64 PyTorch gives no comparable float output here")
    off = float32_noise(want, exact)
    vs = differences(exact, have)
    vs_float64 = float(vs.max()) if vs.size else 0.0
    judged = replace(error, vs_float64=vs_float64, float32_off=off)
    if judged.ok:
        note = (
            f"ill-conditioned here (torch-f32 itself is off by {off:.3g} from float64 PyTorch;"
            f" tract {vs_float64:.3g}, within {judged.allowance:.3g})"
        )
    else:
        note = (
            f"tract is {vs_float64:.3g} off float64 PyTorch where torch-f32 is {off:.3g} off"
            f" (allowed {judged.allowance:.3g}): not float32 rounding"
        )
    return replace(judged, note=note)

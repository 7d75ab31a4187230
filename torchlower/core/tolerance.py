"""Default tolerances of the tract check, shared by ``export`` and ``check`` (numpy only).

Each scales with the largest finite magnitude of the expected outputs (an inf must not make the
tolerance inf): float32 gets 1e-4 of it (at least 1e-4 absolute; one f16 step for f16 outputs),
f16 weights and compute 1e-2,
and a quantized model one quantization step more, since tract and torch may round a code to its
neighbour (ties, requantization order), which moves the float result by one step.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np


def output_scale(expected: Sequence[np.ndarray]) -> float:
    finite = [e[np.isfinite(e)] for e in expected if e.dtype.kind == "f"]
    return max(1.0, max((float(np.abs(f).max()) for f in finite if f.size), default=1.0))


def default(expected: Sequence[np.ndarray]) -> float:
    """1e-4 relative to the largest finite magnitude (at least absolute 1e-4); an f16 output
    (a model computing in f16 itself) cannot be closer than its own rounding, so at least one
    f16 step (2**-10 relative, ×1.01) at that magnitude."""
    tol = 1e-4 * output_scale(expected)
    if any(e.dtype == np.float16 for e in expected):
        tol = max(tol, 1.01 * 2.0**-10 * output_scale(expected))
    return tol


def f16(expected: Sequence[np.ndarray]) -> float:
    """1e-2 relative: f16 keeps ~3 decimal digits, and layers add up."""
    return 1e-2 * output_scale(expected)


def quantized(expected: Sequence[np.ndarray], steps: Sequence[float]) -> float:
    """The default, but at least one step (×1.01) of the largest of ``steps`` (dequantized scales)."""
    return max(default(expected), 1.01 * max(steps)) if steps else default(expected)


def quant_steps(quant_text: str | None) -> list[float]:
    """Every ``scale`` declared in a graph.quant document."""
    return [float(m) for m in re.findall(r"scale\s*=\s*([-+0-9.eE]+)", quant_text or "")]

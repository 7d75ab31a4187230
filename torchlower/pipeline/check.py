"""Stage 7, check: the written archive runs in tract at the example, at random inputs like it
and, under dynamic axes, at other sizes; every point's error per output is kept for the
report, and a mismatch is a ``CheckError`` (the staged file is then removed by ``write``)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchlower.core import dynamic, model_io
from torchlower.core import tolerance as tolerances
from torchlower.core.comparison import OutputError, compare
from torchlower.errors import CheckError
from torchlower.nnef.builder import NNEFBuilder
from torchlower.nnef.tract import run_in_tract
from torchlower.pipeline import float64, verification

log = logging.getLogger("torchlower")


def check_export(
    artifact: Path,
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    expected: list[torch.Tensor],
    names: Sequence[str],
    spec: dynamic.Spec | None,
    tolerance: float | None,
    builder: NNEFBuilder,
    dequantized: dict[str, torch.Tensor] | None,
    shown: Path,
    special: bool = False,
) -> verification.Outcome:
    """The artifact checked at every point; compressed exports compare with the dequantized
    model (and report the original model's error beside it). ``shown`` is the path messages
    name (the user's, not the staging name). ``special``: the special-values point always
    counts (``check="special"``), not only where torch's outputs there are finite."""

    def run(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return model_io.flatten_outputs(module(*inputs))

    def run_dequantized(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return model_io.flatten_outputs(torch.func.functional_call(module, dequantized, tuple(inputs)))

    def tol(want: Sequence[Any]) -> float:
        if tolerance is not None:
            return tolerance
        if builder.precision == "f16":
            return tolerances.f16(want)
        return tolerances.quantized(want, builder.dequantized_steps)

    points = [verification.Point("example", example, None if dequantized else expected)]
    points += verification.random_points(example, reference=run_dequantized if dequantized else run)
    points += verification.special_point(example, strict=special)
    if spec is not None:
        for size in spec.check_points():
            points.append(verification.Point(size_label(size), spec.example_at(example, size)))
    wide = float64.reference(module, dequantized)
    if dequantized is None:
        outcome = verification.check_points(artifact, points, run, names, tol, shown=shown, wide=wide)
    else:
        outcome = verification.check_points(
            artifact, points, run_dequantized, names, tol, original=run, shown=shown, wide=wide
        )
    for size, why in spec.skipped if spec is not None else []:
        shapes = [tuple(t.shape) for t in spec.example_at(example, size)]
        outcome.points.append(verification.CheckPoint(size_label(size), shapes, skipped=why))
    return outcome


def size_label(size: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in size.items())


def verify(
    artifact: Path,
    example: Sequence[torch.Tensor],
    expected: Sequence[torch.Tensor],
    names: Sequence[str],
    tolerance: float | None = None,
) -> list[OutputError]:
    """Run ``artifact`` in tract and compare with ``expected``; raise ``CheckError`` on mismatch."""
    actual = run_in_tract(artifact, [t.detach().numpy() for t in example])
    want = [t.detach().numpy() for t in expected]
    tol = tolerance if tolerance is not None else tolerances.default(want)
    errors = compare(names, want, actual, tol)
    for e in errors:
        log.info("output %s: max |torch - tract| = %.3g (rel %.3g)", e.name, e.max_abs, e.max_rel)
    bad = [e for e in errors if not e.ok]
    if bad:
        detail = "; ".join(f"{e.name}: max abs {e.max_abs:.3g} > {e.tolerance:.3g}" for e in bad)
        raise CheckError(f"{artifact}: tract disagrees with PyTorch — {detail}", errors)
    return errors

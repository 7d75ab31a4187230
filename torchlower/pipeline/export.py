"""``torchlower.export``: model → verified artifact, the one call most users need.

It is the shortest composition of the pipeline's stages (``torchlower/pipeline``): validate the
arguments (``request``), run the model (``reference``), capture and lower (``capture``),
compress and optimize (``optimize``), write staged (``write``), check in tract (``check``) and
report (``report``). ``torchlower.llm.export`` composes the same stages around its own.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from torchlower.core import progress
from torchlower.nnef import archive
from torchlower.pipeline import capture, optimize, reference, report, request, write
from torchlower.pipeline import check as checks
from torchlower.pipeline.check import verify
from torchlower.pipeline.report import ExportReport, TensorInfo
from torchlower.pipeline.request import AUTO_ORDER, COMPRESSIONS, FRONTENDS
from torchlower.rules import coverage

__all__ = ["AUTO_ORDER", "COMPRESSIONS", "FRONTENDS", "ExportReport", "TensorInfo", "export", "verify"]


def export(
    model: nn.Module,
    args: torch.Tensor | Sequence[torch.Tensor],
    path: str | os.PathLike[str],
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    frontend: str = "auto",
    check: bool | str = True,
    tolerance: float | None = None,
    precision: str = "f32",
    compress: str | None = None,
    dynamic_axes: dict[str, dict[int, str]] | None = None,
    dynamic_shapes: Any = None,
    allow_value_dependent_trace: bool = False,
) -> ExportReport:
    """Export ``model`` called on ``args`` to an NNEF artifact at ``path`` and verify it in tract.

    ``precision="f16"`` stores float weights and computes in f16 (inputs and outputs stay f32);
    ``compress="q4_0"`` stores eligible weights in tract's 4-bit blocks (docs/compression.md).

    ``frontend="auto"`` tries ``export``, then ``jit``, then ``fx``; the report names the one
    that produced the artifact and notes why the earlier ones were skipped.
    ``dynamic_axes={"x": {0: "B", 1: "S"}}`` (keyed by input name) makes those sizes symbolic
    for every front end; ``dynamic_shapes`` (``torch.export.Dim``) is the ``export`` front
    end's spelling (docs/dynamic-axes.md). The check then also runs at other sizes.
    A trace that took a Python value from a tensor computed from the inputs (``if x.sum() > 0``,
    ``float(x.max())``, ``.item()``, a data-dependent loop count) would freeze the example's value:
    ``jit`` then raises ``ValueDependentTraceError`` (a ``TraceError``) naming the source line,
    and ``auto`` tries the next front end. ``allow_value_dependent_trace=True`` accepts such a
    jit trace for a value known to be constant (the report notes the lines; the check still runs
    on random inputs besides the example).
    The user's model is never modified: lowering reads parameters, it never replaces them.
    """
    req = request.request(
        model, args, path, input_names=input_names, output_names=output_names, frontend=frontend,
        check=check, tolerance=tolerance, precision=precision, compress=compress,
        dynamic_axes=dynamic_axes, dynamic_shapes=dynamic_shapes,
        allow_value_dependent_trace=allow_value_dependent_trace,
    )  # fmt: skip
    ref = reference.run_reference(model, req, output_names)
    captured = capture.capture(req, ref)
    builder = captured.builder
    dequantized = optimize.compress(builder, ref.module, compress)
    optimize.optimize(builder)
    weights = builder.live_weights()
    builder.example_sizes = req.example_sizes  # recorded so `check` without sizes runs there
    with write.staging(req.target, check) as staged:
        written = archive.write(staged, builder.graph_text(), weights, builder.quant_text())
        result = report.export_report(written, req, ref, captured, weights)
        if check:
            with progress.stage("checking in tract"):
                outcome = checks.check_export(
                    written, ref.module, req.example, ref.expected, ref.output_names, req.spec,
                    tolerance, builder, dequantized, req.target, special=req.check == "special",
                )  # fmt: skip
            report.record_check(result, outcome)
            coverage.verified(result.rules_used)
    result.path = req.target
    return result

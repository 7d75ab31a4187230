"""``torchlower.export``: model → verified artifact, the one call most users need.

It is the shortest composition of the pipeline's stages (``torchlower/pipeline``): validate the
arguments (``request``), run the model (``reference``), capture and lower (``capture``),
compress and optimize (``optimize``), write staged (``write``), check in tract (``check``) and
report (``report``). ``torchlower.llm.export`` composes the same stages around its own.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchlower.core import progress
from torchlower.errors import CheckError, InvalidArgumentError, StreamingError
from torchlower.nnef import archive, stream_forms
from torchlower.nnef.builder import NNEFBuilder
from torchlower.nnef.graph_model import Graph
from torchlower.pipeline import capture, optimize, reference, report, request, stream_check, write
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
    stream: dict[str, int] | None = None,
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
    ``stream={"T": 16}`` also pulses the archive in tract at 16 steps of the dynamic symbol
    ``T`` and checks it chunk by chunk against PyTorch on the whole input (``report.stream``;
    the verified pulse and delay are recorded in the archive; docs/streaming.md).
    """
    req = request.request(
        model, args, path, input_names=input_names, output_names=output_names, frontend=frontend,
        check=check, tolerance=tolerance, precision=precision, compress=compress,
        dynamic_axes=dynamic_axes, dynamic_shapes=dynamic_shapes,
        allow_value_dependent_trace=allow_value_dependent_trace,
    )  # fmt: skip
    streaming = stream_check.stream_argument(stream, req.axes, check, req.input_names)
    if streaming is not None and compress is not None:
        raise InvalidArgumentError("stream= with compress= is not supported yet: export without compress")
    ref = reference.run_reference(model, req, output_names)
    captured = capture.capture(req, ref)
    builder = captured.builder
    dequantized = optimize.compress(builder, ref.module, compress)
    optimize.optimize(builder)
    if streaming is not None:
        captured.notes.extend(stream_forms.pulse_safe(builder))
        try:
            floor, graph = refuse_hazards(builder, streaming[0])
        except StreamingError as exc:
            raise stream_check.with_source(exc, ref.module) from None
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
            if streaming is not None:
                try:
                    result.stream = stream_stage(
                        written, ref.module, req, ref.output_names, streaming, tolerance, floor, graph
                    )
                except StreamingError as exc:
                    raise stream_check.with_source(exc, ref.module) from None
                builder.stream_note = result.stream.note()  # the archive records what was verified
                archive.write(written, builder.graph_text(), weights, builder.quant_text())
            coverage.verified(result.rules_used)
    result.path = req.target
    return result


def stream_stage(
    written: Path,
    module: nn.Module,
    req: request.Request,
    names: Sequence[str],
    streaming: tuple[str, int],
    tolerance: float | None,
    floor: int,
    graph: Graph,
) -> stream_check.StreamReport:
    """The streaming check (``pipeline/stream_check.py``) of a checked archive."""
    from torchlower.core import model_io
    from torchlower.core import tolerance as tolerances

    def run(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        with torch.no_grad():
            return model_io.flatten_outputs(module(*inputs))

    def tol(want: Sequence[Any]) -> float:
        if tolerance is not None:
            return tolerance
        return tolerances.f16(want) if req.precision == "f16" else tolerances.default(want)

    assert req.spec is not None  # stream_argument required the symbol among the dynamic axes
    symbol, pulse = streaming
    with progress.stage(f"streaming in tract ({symbol} pulse {pulse})"):
        points = stream_check.export_points(req.example, req.spec, symbol, pulse)
        try:
            return stream_check.check_stream(
                written,
                run,
                points,
                req.input_names,
                names,
                symbol,
                pulse,
                tol,
                req.target,
                None,
                floor,
                graph,
            )
        except CheckError as exc:
            raise CheckError(f"{exc} (nothing written)", exc.errors) from None


def refuse_hazards(builder: NNEFBuilder, symbol: str) -> tuple[int, Graph]:
    """What tract pulses without complaint and streams wrong, refused before anything is written;
    returns the multiple every pulse must be that tract does not enforce (``pulse_floor``)."""
    from torchlower.nnef.parse import parse
    from torchlower.nnef.pulse import hazards, pulse_floor

    graph = parse(builder.graph_text().encode())
    found = hazards(graph, symbol)
    if found:
        raise StreamingError(f"the model cannot stream over {symbol}: {found[0]}")
    return pulse_floor(graph), graph

"""Stage 8, report: what was written (inputs and outputs with their symbolic shapes, op
histogram, weight bytes by format) and how well it matches PyTorch at every checked point."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from torchlower.core.comparison import OutputError
from torchlower.core.values import Value
from torchlower.pipeline import verification, write
from torchlower.pipeline.capture import Captured
from torchlower.pipeline.reference import Reference
from torchlower.pipeline.request import Request


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int | str, ...]
    dtype: str


@dataclass
class ExportReport:
    """What was written and how well it matches PyTorch."""

    path: Path
    frontend: str
    inputs: list[TensorInfo]
    outputs: list[TensorInfo]
    op_histogram: Counter[str]
    weight_bytes: int
    errors: list[OutputError] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    precision: str = "f32"
    compress: str | None = None
    weight_bytes_by_format: dict[str, int] = field(default_factory=dict)
    # with compress=: `errors` compare with PyTorch running the dequantized weights, these with
    # the original model (informative, never failing)
    original_errors: list[OutputError] = field(default_factory=list)
    # every input set checked (example, random inputs like it, other sizes), errors per output
    points: list[verification.CheckPoint] = field(default_factory=list)
    original_points: list[verification.CheckPoint] = field(default_factory=list)
    rules_used: list[str] = field(default_factory=list)  # registered keys of the rules that ran
    stream: Any = None  # pipeline.stream_check.StreamReport of export(stream=...)

    @property
    def checked(self) -> bool:
        return bool(self.errors)

    @property
    def max_abs_error(self) -> float:
        return max((e.max_abs for e in self.errors), default=0.0)


def export_report(
    path: Path, req: Request, ref: Reference, captured: Captured, weights: dict[str, Any]
) -> ExportReport:
    """The report of a written (not yet checked) export."""
    builder = captured.builder
    return ExportReport(
        path=path,
        frontend=captured.frontend,
        inputs=[
            TensorInfo(n, shape_text(v.shape), _dtype(t))
            for n, t, v in zip(req.input_names, req.example, builder.inputs, strict=True)
        ],
        outputs=[
            TensorInfo(n, output_shape(v, t), _dtype(t))
            for n, t, (_, v) in zip(ref.output_names, ref.expected, builder.outputs, strict=True)
        ],
        op_histogram=builder.op_histogram(),
        weight_bytes=write.weight_bytes(weights),
        notes=captured.notes,
        precision=req.precision,
        compress=req.compress,
        weight_bytes_by_format=write.bytes_by_format(weights),
        rules_used=builder.rules_used,
    )


def record_check(report: ExportReport, outcome: verification.Outcome) -> None:
    report.points, report.original_points = outcome.points, outcome.original
    report.errors, report.original_errors = outcome.errors(), outcome.errors(original=True)


def output_shape(value: Value, observed: torch.Tensor) -> tuple[int | str, ...]:
    """The graph's symbolic output shape under dynamic axes, else the observed one."""
    if value.is_symbolic and len(value.shape) == observed.dim():
        return shape_text(value.shape)
    return tuple(observed.shape)


def shape_text(shape: Any) -> tuple[int | str, ...]:
    return tuple(d if isinstance(d, int) else str(d) for d in shape)


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")

"""Stage 1, validate: the user's arguments checked and resolved into one ``Request`` (example
tensors, input names, dynamic axes and their bounds) before any tracing starts."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchlower.core import dynamic, model_io
from torchlower.errors import InvalidArgumentError
from torchlower.pipeline import validate

FRONTENDS = ("jit", "fx", "export")  # "auto" tries export, then jit, then fx
AUTO_ORDER = ("export", "jit", "fx")
COMPRESSIONS = ("q4_0",)


@dataclass(frozen=True)
class Request:
    """What to export: everything later stages need from the arguments, validated."""

    target: Path
    example: tuple[torch.Tensor, ...]
    input_names: list[str]
    axes: dict[str, dict[int, str]]  # input name → axis → symbol
    spec: dynamic.Spec | None  # the dynamic axes with bounds and check sizes, None when static
    frontend: str  # "auto" or one of FRONTENDS
    precision: str
    compress: str | None
    check: bool | str  # True, False or "special" (the special-values point always counts)
    tolerance: float | None
    allow_value_dependent: bool
    scripted: bool = False  # a TorchScript module: only the jit front end reads its graph

    @property
    def candidates(self) -> tuple[str, ...]:
        """The front ends to try, in order."""
        if self.frontend == "auto":
            return ("jit",) if self.scripted else AUTO_ORDER
        return (self.frontend,)

    @property
    def example_sizes(self) -> dict[str, int]:
        """Each dynamic symbol's value in the example (``check`` without sizes runs there): ``h``
        of an axis ``32*h``, and the symbols of multiples adopted since (``_H`` of ``H = 32*_H``)."""
        return dict(self.spec.base) if self.spec is not None else {}


def request(
    model: nn.Module,
    args: torch.Tensor | Sequence[torch.Tensor],
    path: str | os.PathLike[str],
    *,
    input_names: Sequence[str] | None,
    output_names: Sequence[str] | None,
    frontend: str,
    check: bool | str,
    tolerance: float | None,
    precision: str,
    compress: str | None,
    dynamic_axes: dict[str, dict[int, str]] | None,
    dynamic_shapes: Any,
    allow_value_dependent_trace: bool,
) -> Request:
    """Validate ``torchlower.export``'s arguments (typed errors naming the argument)."""
    validate.export_arguments(
        model,
        args,
        path,
        input_names=input_names,
        output_names=output_names,
        frontend=frontend,
        frontends=(*FRONTENDS, "auto"),
        check=check,
        tolerance=tolerance,
    )
    validate.value_dependent_argument(allow_value_dependent_trace, frontend)
    scripted = isinstance(model, torch.jit.ScriptModule)
    if scripted and frontend not in ("jit", "auto"):
        raise InvalidArgumentError(
            f"frontend={frontend!r} cannot read a TorchScript module ({type(model).__name__}, from"
            " torch.jit.script or torch.jit.load): its graph is read by the jit front end; use"
            " frontend='jit' (or 'auto')"
        )
    compression_options(precision, compress)
    example = model_io.as_tuple(args)
    names_in = model_io.input_names(model, example, input_names)
    if dynamic_shapes is not None:
        if dynamic_axes is not None:
            raise InvalidArgumentError("give dynamic_axes or dynamic_shapes, not both")
        dynamic_axes = dynamic.axes_from_dynamic_shapes(dynamic_shapes, names_in, example, model)
    axes = validate.dynamic_axes(dynamic_axes, names_in, [t.dim() for t in example])
    bounds = (
        dynamic.bounds_from_dynamic_shapes(dynamic_shapes)
        if dynamic_shapes is not None
        else validate.dynamic_bounds(dynamic_axes)
    )
    spec = dynamic.Spec.build(axes, names_in, example, bounds)
    if spec is not None:  # under auto another front end may take the axis whole: no restriction
        spec.export_restricts = frontend == "export"
    return Request(
        Path(path),
        example,
        names_in,
        axes,
        spec,
        frontend,
        precision,
        compress,
        check,
        tolerance,
        allow_value_dependent_trace,
        scripted,
    )


def compression_options(precision: str, compress: str | None) -> None:
    from torchlower.nnef.builder import PRECISIONS
    from torchlower.nnef.quant import FORMATS

    if precision not in PRECISIONS:
        raise InvalidArgumentError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    if compress is not None and compress not in COMPRESSIONS:
        raise InvalidArgumentError(
            f"compress must be None or one of {', '.join(COMPRESSIONS)}; got {compress!r}"
        )
    assert set(COMPRESSIONS) <= set(FORMATS)

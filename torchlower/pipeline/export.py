"""``torchlower.export``: model → verified artifact, the one call most users need."""

from __future__ import annotations

import contextlib
import logging
import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchlower.core import dynamic, model_io, progress
from torchlower.core import tolerance as tolerances
from torchlower.core.comparison import OutputError, compare
from torchlower.core.staging import staged
from torchlower.core.values import MISSING, Value
from torchlower.errors import (
    CheckError,
    DynamicAxisError,
    InvalidArgumentError,
    LoweringError,
    TorchlowerError,
    TraceError,
    UnsupportedOpsError,
    ValueDependentTraceError,
)
from torchlower.frontends.session import Session
from torchlower.nnef import archive, guards, passes
from torchlower.nnef.builder import NNEFBuilder
from torchlower.nnef.tract import run_in_tract
from torchlower.pipeline import validate, verification
from torchlower.rules import NNEF_RULES, coverage

log = logging.getLogger("torchlower")

FRONTENDS = ("jit", "fx", "export")  # "auto" tries export, then jit, then fx
AUTO_ORDER = ("export", "jit", "fx")
COMPRESSIONS = ("q4_0",)


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

    @property
    def checked(self) -> bool:
        return bool(self.errors)

    @property
    def max_abs_error(self) -> float:
        return max((e.max_abs for e in self.errors), default=0.0)


def export(
    model: nn.Module,
    args: torch.Tensor | Sequence[torch.Tensor],
    path: str | os.PathLike[str],
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    frontend: str = "auto",
    check: bool = True,
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
    _check_compression_options(precision, compress)
    example = model_io.as_tuple(args)
    target = Path(path)
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

    module = model_io.eval_view(model)
    try:
        with torch.no_grad():
            returned = module(*example)
        expected = model_io.flatten_outputs(returned)
    except TorchlowerError:
        raise
    except Exception as exc:  # the model itself refuses the example: bad input, say so
        raise InvalidArgumentError(
            f"{type(model).__name__} fails on the example inputs"
            f" ({', '.join(f'{list(t.shape)} {t.dtype}' for t in example)}):"
            f" {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        ) from exc
    names_out = model_io.output_names(expected, output_names, returned)
    if spec is not None:  # check sizes the model itself refuses are skipped (and reported)
        spec.probe(lambda inputs: module(*inputs), example)

    notes: list[str] = []
    failures: list[TorchlowerError] = []
    for candidate in AUTO_ORDER if frontend == "auto" else (frontend,):
        try:
            with progress.stage(f"tracing ({candidate})", unit="ops"):  # front end retotals: lowering
                builder = _build(
                    candidate,
                    module,
                    example,
                    names_in,
                    names_out,
                    len(expected),
                    precision,
                    spec,
                    allow_value_dependent_trace,
                )
        except (TraceError, LoweringError, UnsupportedOpsError) as exc:
            if frontend != "auto":
                raise
            failures.append(exc)
            notes.append(f"{candidate} front end skipped: {_first_line(exc)}")
            continue
        frontend = candidate
        break
    else:
        # the most useful diagnosis first: a dynamic axis fixed by an argument (bounds), then a
        # value-dependent trace (it names the line to rewrite), then the first front end's
        preferred = (DynamicAxisError, ValueDependentTraceError)
        chosen = next((f for kind in preferred for f in failures if isinstance(f, kind)), failures[0])
        for note in notes:
            chosen.add_note(note)
        raise chosen
    notes += builder.notes
    dequantized = _compress(builder, module, compress) if compress is not None else None
    guards.before_passes(builder)  # rewrites the passes may optimize further (nnef/guards.py)
    passes.optimize(builder)  # leaner graph: folds, merges, shared constants (nnef/passes.py)
    guards.apply(builder)  # around tract optimizer bugs (nnef/guards.py)
    weights = builder.live_weights()
    builder.example_sizes = {  # recorded so `check` without sizes runs where export verified
        sym: int(example[names_in.index(name)].shape[axis])
        for name, dims in axes.items()
        for axis, sym in dims.items()
    }
    # checked under a staging name beside the target, renamed after: a failed check leaves no file
    # (unchecked, the write itself is atomic: archive.write goes through a temporary sibling)
    with staged(target) if check else contextlib.nullcontext(target) as staging:
        final = archive.write(staging, builder.graph_text(), weights, builder.quant_text())
        report = ExportReport(
            path=final,
            frontend=frontend,
            inputs=[
                TensorInfo(n, _shape_text(v.shape), str(t.dtype).removeprefix("torch."))
                for n, t, v in zip(names_in, example, builder.inputs, strict=True)
            ],
            outputs=[
                TensorInfo(n, _output_shape(v, t), str(t.dtype).removeprefix("torch."))
                for n, t, (_, v) in zip(names_out, expected, builder.outputs, strict=True)
            ],
            op_histogram=builder.op_histogram(),
            weight_bytes=sum(archive.weight_bytes(t) for t in weights.values()),
            notes=notes,
            precision=precision,
            compress=compress,
            weight_bytes_by_format=_bytes_by_format(weights),
            rules_used=builder.rules_used,
        )
        if check:
            with progress.stage("checking in tract"):
                outcome = _check(
                    final, module, example, expected, names_out, spec, tolerance, builder, dequantized, target
                )
            report.points, report.original_points = outcome.points, outcome.original
            report.errors, report.original_errors = outcome.errors(), outcome.errors(original=True)
            coverage.verified(report.rules_used)
    report.path = target
    return report


def _output_shape(value: Value, observed: torch.Tensor) -> tuple[int | str, ...]:
    """The graph's symbolic output shape under dynamic axes, else the observed one."""
    if value.is_symbolic and len(value.shape) == observed.dim():
        return _shape_text(value.shape)
    return tuple(observed.shape)


def _shape_text(shape: Any) -> tuple[int | str, ...]:
    return tuple(d if isinstance(d, int) else str(d) for d in shape)


def _check(
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
) -> verification.Outcome:
    """The artifact checked at the example, at random inputs like it and, under dynamic axes,
    at other sizes; compressed exports compare with the dequantized model (and report the
    original model's error beside it)."""

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
    points += verification.random_points(example)
    if spec is not None:
        for size in spec.check_points():
            points.append(verification.Point(_size_label(size), spec.example_at(example, size)))
    if dequantized is None:
        outcome = verification.check_points(artifact, points, run, names, tol, shown=shown)
    else:
        outcome = verification.check_points(
            artifact, points, run_dequantized, names, tol, original=run, shown=shown
        )
    for size, why in spec.skipped if spec is not None else []:
        shapes = [tuple(t.shape) for t in spec.example_at(example, size)]
        outcome.points.append(verification.CheckPoint(_size_label(size), shapes, skipped=why))
    return outcome


def _size_label(size: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in size.items())


def _check_compression_options(precision: str, compress: str | None) -> None:
    from torchlower.nnef.builder import PRECISIONS
    from torchlower.nnef.quant import FORMATS

    if precision not in PRECISIONS:
        raise InvalidArgumentError(f"precision must be one of {', '.join(PRECISIONS)}; got {precision!r}")
    if compress is not None and compress not in COMPRESSIONS:
        raise InvalidArgumentError(
            f"compress must be None or one of {', '.join(COMPRESSIONS)}; got {compress!r}"
        )
    assert set(COMPRESSIONS) <= set(FORMATS)


def _compress(builder: NNEFBuilder, module: nn.Module, compress: str) -> dict[str, torch.Tensor]:
    """Pack eligible weights; returns the dequantized parameters PyTorch checks against."""
    from torchlower.nnef import quant

    params = dict(module.named_parameters()) | dict(module.named_buffers())
    return quant.compress_weights(builder, quant.FORMATS[compress], params)


def _bytes_by_format(weights: dict[str, Any]) -> dict[str, int]:
    from torchlower.nnef.quant import BlockQuantized

    out: Counter[str] = Counter()
    for w in weights.values():
        key = w.format.name if isinstance(w, BlockQuantized) else str(w.dtype).removeprefix("torch.")
        out[key] += archive.weight_bytes(w)
    return dict(sorted(out.items()))


def _build(
    frontend: str,
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    names_in: Sequence[str],
    names_out: Sequence[str],
    n_expected: int,
    precision: str = "f32",
    spec: dynamic.Spec | None = None,
    allow_value_dependent: bool = False,
) -> NNEFBuilder:
    """A fresh builder holding ``module`` lowered by one front end, outputs set."""
    builder = NNEFBuilder(precision=precision, rules=NNEF_RULES)
    builder.reserve(list(names_in) + list(names_out))
    inputs = [
        builder.add_input(n, t.dtype, spec.input_shape(i, t) if spec else tuple(t.shape))
        for i, (n, t) in enumerate(zip(names_in, example, strict=True))
    ]
    session = Session(builder, frontend)
    outputs = _lower(frontend, builder, module, example, inputs, session, spec, allow_value_dependent)
    session.finish()
    if len(outputs) != n_expected or any(o is MISSING for o in outputs):
        raise LoweringError(f"the graph has {len(outputs)} outputs, the model returns {n_expected}")
    builder.set_outputs(names_out, [_as_value(o) for o in outputs])
    builder.rules_used = sorted(session.used)
    builder.assertions = spec.assertions() if spec is not None else []
    return builder


def _first_line(exc: BaseException) -> str:
    if isinstance(exc, UnsupportedOpsError):
        return f"UnsupportedOpsError: no rule for {', '.join(o.op for o in exc.ops)}"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


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


def _lower(
    frontend: str,
    builder: NNEFBuilder,
    module: nn.Module,
    example: tuple[torch.Tensor, ...],
    inputs: list[Value],
    session: Session,
    spec: dynamic.Spec | None = None,
    allow_value_dependent: bool = False,
) -> list[Any]:
    if frontend == "fx":
        from torchlower.frontends.fx import lower_module

        return lower_module(builder, module, inputs, example, session, spec)
    if frontend == "export":
        from torchlower.frontends.export import lower_export

        return lower_export(builder, module, example, inputs, session, spec)
    from torchlower.frontends.jit import OPT_IN, ModuleTracer, lower_jit

    tracer = ModuleTracer(module, args=example, allow_value_dependent=allow_value_dependent)
    outputs = lower_jit(builder, tracer, inputs, session, spec)
    if tracer.value_dependence:
        where = "; ".join(str(c) for c in tracer.value_dependence)
        builder.notes.append(f"value-dependent jit trace accepted ({OPT_IN}): {where}")
    return outputs


def _as_value(out: Any) -> Value:
    if isinstance(out, Value):
        return out
    if isinstance(out, (int, float, bool)):
        return Value("const", const=torch.tensor(out))
    raise TorchlowerError(f"an output lowered to {type(out).__name__}, not a tensor")

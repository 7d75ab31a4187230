"""Stage 3, capture and lower: a front end turns the model into rule calls on a fresh NNEF
builder. ``auto`` tries the front ends in order and keeps the first that lowers the whole
model; when all fail, the most useful of their errors is raised with the others as notes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
from torch import nn

from torchlower.core import dynamic, dynamic_probe, progress, size_floors
from torchlower.core.values import MISSING, Value
from torchlower.errors import (
    DynamicAxisError,
    LoweringError,
    TorchlowerError,
    TraceError,
    UnsupportedOpsError,
    ValueDependentTraceError,
)
from torchlower.frontends.provenance import raised_at
from torchlower.frontends.session import Session
from torchlower.nnef.builder import NNEFBuilder
from torchlower.pipeline.reference import Reference
from torchlower.pipeline.request import Request
from torchlower.rules import NNEF_RULES


@dataclass
class Captured:
    """The lowered graph, which front end produced it, and what the report should say."""

    builder: NNEFBuilder
    frontend: str
    notes: list[str] = field(default_factory=list)


def capture(req: Request, ref: Reference) -> Captured:
    notes: list[str] = []
    failures: list[TorchlowerError] = []
    for candidate in req.candidates:
        try:
            with progress.stage(f"tracing ({candidate})", unit="ops"):  # front end retotals: lowering
                builder = lower(
                    candidate,
                    ref.module,
                    req.example,
                    req.input_names,
                    ref.output_names,
                    len(ref.expected),
                    req.precision,
                    req.spec,
                    req.allow_value_dependent,
                )
        except (TraceError, LoweringError, UnsupportedOpsError) as exc:
            if req.frontend != "auto":
                raise
            failures.append(exc)
            notes.append(f"{candidate} front end skipped: {first_line(exc)}")
            continue
        adopted = req.spec.notes if req.spec is not None else []  # multiples the probe adopted
        return Captured(builder, candidate, notes + adopted + builder.notes)
    # the most useful diagnosis first: a dynamic axis fixed by an argument (bounds), then a
    # value-dependent trace (it names the line to rewrite), then the first front end's
    preferred = (DynamicAxisError, ValueDependentTraceError)
    chosen = next((f for kind in preferred for f in failures if isinstance(f, kind)), failures[0])
    for note in notes:
        chosen.add_note(note)
    raise chosen


def lower(
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
    find = partial(dynamic_probe.lowest_size, spec, lambda xs: module(*xs), example) if spec else _no_floor
    try:
        with size_floors.floors_in_force(find) as floors:
            outputs = _run_frontend(
                frontend, builder, module, example, inputs, session, spec, allow_value_dependent
            )
    except (TorchlowerError, KeyboardInterrupt, MemoryError):
        raise
    except Exception as exc:  # a front end never lets a raw exception out: auto tries the next
        line = raised_at(exc)
        raise TraceError(
            f"the {frontend} front end failed on {type(module).__qualname__}"
            f"{f' at {line}' if line else ''}: {type(exc).__name__}: {first_line_of(exc)}"
        ) from exc
    session.finish()
    if len(outputs) != n_expected or any(o is MISSING for o in outputs):
        raise LoweringError(f"the graph has {len(outputs)} outputs, the model returns {n_expected}")
    builder.set_outputs(names_out, [_as_value(o) for o in outputs])
    builder.rules_used = sorted(session.used)
    if spec is not None:
        adopt_implied_bounds(builder, spec)
        adopt_floors(builder, spec, floors)
    builder.assertions = spec.assertions() if spec is not None else []
    return builder


def adopt_implied_bounds(builder: NNEFBuilder, spec: dynamic.Spec) -> None:
    """Upper bounds the lowered graph assumes (a table of 64 rows sliced to T) become the
    symbols' declared bounds, asserted in the archive and said in the report; PyTorch cannot run
    beyond them either (the table has no more rows), so nothing the model could do is refused."""
    for symbol, (bound, why) in sorted(builder.implied_bounds.items()):
        lo, hi = spec.bounds.get(symbol, (1, None))
        if symbol not in spec.base or (hi is not None and hi <= bound):
            continue
        if spec.base[symbol] > bound:
            raise DynamicAxisError(
                f"{spec.where([symbol])}: {why}, so the graph holds for {symbol} <= {bound} only, but"
                f" the example has {symbol} = {spec.base[symbol]}"
            )
        spec.bounds[symbol] = (lo, bound)
        builder.notes.append(f"dynamic axis {spec.where([symbol])}: {symbol} <= {bound} adopted ({why})")


def adopt_floors(builder: NNEFBuilder, spec: dynamic.Spec, floors: size_floors.Floors) -> None:
    """Lower bounds a size decision of the lowering assumed (``core/size_floors``): PyTorch fails
    below them, so the archive declares them (``T >= 400``), the check runs at the bound and the
    report says which sizes are refused and why."""
    for symbol, decided in sorted(floors.used.items()):
        low = floors.known[symbol]
        lo, hi = spec.bounds.get(symbol, (1, None))
        if low is None or low <= lo:
            continue
        spec.bounds[symbol] = (low, hi)
        spec.extra_checks.append({**spec.base, symbol: low})
        builder.notes.append(
            f"dynamic axis {spec.where([symbol])}: {symbol} >= {low} adopted (PyTorch fails at"
            f" {symbol}={low - 1}; the graph's sizes need it: {decided} is decided from there)"
        )


def _no_floor(symbol: str) -> None:
    return None


def first_line_of(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else repr(exc)


def first_line(exc: BaseException) -> str:
    if isinstance(exc, UnsupportedOpsError):
        return f"UnsupportedOpsError: no rule for {', '.join(o.op for o in exc.ops)}"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _run_frontend(
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

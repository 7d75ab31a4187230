"""The FX front end: trace with ``Tracer``, interpret the graph with symbolic values.

``Interpreter`` (``fx_interpreter``) is generic over ``builder.rules``: it runs an FX graph
(from ``Tracer`` or from ``torch.export``) where every tensor is a ``Value``. What FX cannot
trace falls back to ``torch.export`` (``frontends/export.py``). This module is the public
``torchlower.fx``: ``Tracer``, ``trace``, ``Interpreter``, ``lower_fx``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from torchlower.core import progress
from torchlower.core.values import Value
from torchlower.errors import InvalidArgumentError, LoweringError
from torchlower.frontends import export, fx_dynamic, fx_interpreter
from torchlower.frontends.export import lower_export, lower_submodule
from torchlower.frontends.fx_trace import LEAVES, ShapePass, Tracer, trace
from torchlower.frontends.session import Session
from torchlower.rules import NNEF_RULES

__all__ = ["Interpreter", "Tracer", "lower_fx", "lower_module", "trace"]


class Interpreter(fx_interpreter.Interpreter):
    """The FX interpreter with ``torch.export`` as the fallback for what FX cannot trace."""

    def __init__(
        self, module: nn.Module, builder: Any, session: Session | None = None, *, prefix: str = ""
    ) -> None:
        super().__init__(module, builder, session, prefix=prefix, escape=export.ESCAPE)


def lower_module(
    builder: Any,
    model: nn.Module,
    inputs: Sequence[Value],
    example: Sequence[Any],
    session: Session,
    spec: Any = None,
) -> list[Any]:
    """Lower ``model`` called on ``inputs`` (``example`` holds matching real tensors); flat outputs.

    With a dynamic ``spec``, shapes are fitted over runs at every size point (fx_dynamic.py).
    """
    if builder.rules.lookup_module(type(model)) is not None:
        metas = fx_dynamic.output_metas(model, example, spec)
        out = session.apply_module(model, list(inputs), type(model).__name__, metas)
    elif Tracer(builder.rules).is_leaf_module(model, ""):  # a torch.nn module FX cannot trace
        if spec is not None:
            return lower_export(builder, model, example, inputs, session, spec)
        out = lower_submodule(builder, session, model, tuple(inputs), {}, (tuple(example), {}), "")
    else:
        gm = trace(model, builder.rules, example)
        builder.notes += [f"fx: lowered {leaf}" for leaf in gm.meta[LEAVES]]
        if spec is not None:
            fx_dynamic.fit_shapes(gm, builder.rules, spec, example)
        else:
            with torch.no_grad():
                ShapePass(gm, builder.rules).propagate(*example)
        progress.retotal(sum(n.op.startswith("call_") for n in gm.graph.nodes), "lowering")
        out = Interpreter(gm, builder, session).run(*inputs)
    return pytree.tree_leaves(out)


def lower_fx(
    builder: Any,
    model: nn.Module,
    inputs: Sequence[Value] | None = None,
    *,
    output_names: Sequence[str] | None = None,
) -> Any:
    """Lower ``model`` into ``builder`` through FX and set its outputs; returns the builder.

    ``inputs`` defaults to the builder's declared inputs. Shapes come from one real forward
    pass on tensors of the inputs' (static) shapes; every output leaf must be a ``Value``.
    """
    if builder.rules is None:  # an NNEFBuilder made without a registry: the NNEF rules
        builder.rules = NNEF_RULES
    inputs = list(builder.inputs if inputs is None else inputs)
    example = [_example_tensor(v) for v in inputs]
    session = Session(builder, "fx")
    outputs = lower_module(builder, model, inputs, example, session)
    session.finish()
    bad = sorted({type(o).__name__ for o in outputs if not isinstance(o, Value)})
    if bad:
        raise LoweringError(f"the model's outputs must lower to tensors; found {', '.join(bad)}")
    if output_names is None:
        output_names = ["output"] if len(outputs) == 1 else [f"output_{i}" for i in range(len(outputs))]
    builder.set_outputs(list(output_names), outputs)
    return builder


def _example_tensor(value: Value) -> torch.Tensor:
    if value.is_const:
        return value.const
    if value.shape is None or value.is_symbolic:
        raise InvalidArgumentError(
            f"input {value.name} has shape {value.shape}; lower_fx needs static input shapes (for"
            " symbolic sizes use torchlower.export(..., frontend='fx', dynamic_axes=...), which"
            " has example inputs to run the model at several sizes)"
        )
    dtype = value.dtype or torch.float32
    if dtype.is_floating_point:
        return torch.randn(value.static_shape(), dtype=dtype)
    return torch.zeros(value.static_shape(), dtype=dtype)

"""jit under dynamic axes: the graphs traced at every size point, compared node by node.

``torch.jit.trace`` records concrete sizes; tracing at several size assignments and fitting
each node's sizes (and each constant the tracer baked) to an expression is how a trace becomes
symbolic (``core/size_fit.py``: a node's sizes are fitted as functions of its inputs' sizes,
proven over the captures, with more captures where they do not decide). A node that differs
between the traces is a branch on the size: that axis cannot be dynamic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from torchlower.core.dynamic import UNFIT, Spec, not_dynamic
from torchlower.core.size_fit import PENDING, SizeFitter
from torchlower.core.values import Shape, SymDim
from torchlower.errors import LoweringError
from torchlower.frontends import jit_align
from torchlower.frontends.jit_size_rules import window_hints


@dataclass
class JitOverrides:
    """Symbolic output shapes and fitted constants, by node index in the inlined graph."""

    shapes: dict[int, list[Shape | None]] = field(default_factory=dict)
    constants: dict[int, Any] = field(default_factory=dict)
    resized: dict[int, Shape] = field(default_factory=dict)  # pads/slices some traces lack (jit_align)
    master: int = 0  # the trace whose graph is lowered (it holds every other one)
    graph: Any = None  # that graph, when it is not the example's


def jit_overrides(
    spec: Spec, graphs: Sequence[Any], fitter: SizeFitter, module: nn.Module | None = None
) -> JitOverrides:
    """Compare the inlined graphs traced at every point of ``fitter`` (one pass); sizes become
    expressions. Incomplete while ``fitter.complete()`` is False (more captures are wanted)."""
    fitter.begin()
    master = jit_align.superset([list(g.nodes()) for g in graphs])
    nodes, optional = _aligned([list(g.nodes()) for g in graphs], master)
    arguments = jit_align.pad_arguments(nodes[master], optional)
    out = JitOverrides(master=master)
    for i, node in enumerate(nodes[master]):
        if i in arguments:  # a pad's amounts: recomputed from its fitted output size (jit.py)
            continue
        if i in optional:
            out.resized[i] = _optional_op(fitter, graphs, nodes, master, i)
            continue
        kinds = [ns[i].kind() if i < len(ns) else None for ns in nodes]
        if any(k != node.kind() for k in kinds):
            moved = [p for p, k in zip(fitter.points, kinds, strict=True) if k != node.kind()]
            symbols = [s for s in spec.base if any(p[s] != spec.base[s] for p in moved)]
            raise not_dynamic(
                spec,
                symbols or list(spec.base),
                f"the traced graph changes with it (the model branches on the size; first difference"
                f" at {_scope(node)}: {node.kind()} vs {next(k for k in kinds if k != node.kind())})",
            )
        if node.kind() == "prim::Constant":
            values = [ns[i].output().toIValue() for ns in nodes]
            users = sorted({u.user.kind() for u in node.output().uses()})
            what = f"of a constant used by {', '.join(users)} at {_scope(node)}"
            fitted = fitter.value(values, what)
            if fitted is UNFIT:
                raise not_dynamic(
                    spec,
                    spec.changed(values),
                    f"a constant used by {', '.join(users)} at {_scope(node)}"
                    " was computed in Python from the size",
                )
            if fitted is not PENDING and fitted is not values[0]:
                out.constants[i] = fitted
            continue
        copies = [ns[i] for ns in nodes]
        inputs = _input_sizes(copies)
        hints = _hints(copies, module)
        shapes: list[Shape | None] = []
        for j in range(len(list(node.outputs()))):
            seen = [_sizes(ns[i].outputsAt(j)) for ns in nodes]
            if any(s is None for s in seen):
                shapes.append(None)
                continue
            what = f"of the result of {node.kind()} at {_scope(node)}"
            shape = fitter.shape(seen, inputs, what, hints if j == 0 else None)
            shapes.append(None if any(d is None for d in shape) else shape)  # type: ignore[arg-type]
        if any(s is not None and any(isinstance(d, SymDim) for d in s) for s in shapes):
            out.shapes[i] = shapes
    return out


def _aligned(nodes: list[list[Any]], master: int) -> tuple[list[list[Any]], set[int]]:
    """Each trace's nodes at the master trace's indices, pads/slices it lacks as None
    (``jit_align``); a trace that differs otherwise is left as it is (the comparison then names
    the difference)."""
    out, optional = [], set()
    for ns in nodes:
        got = jit_align.align(nodes[master], ns)
        out.append(ns if got is None else got[0])
        optional |= set() if got is None else got[1]
    return out, optional


def _optional_op(fitter: SizeFitter, graphs: Sequence[Any], nodes: list[list[Any]], m: int, i: int) -> Shape:
    """The output shape of a pad or slice some traces lack, fitted over all of them (where it
    is missing, its output is its input); its amounts follow from that shape (``jit_align``)."""
    master = nodes[m][i]
    seen, inputs = [], []
    for g, ns in enumerate(nodes):
        if ns[i] is not None:
            seen.append(_sizes(ns[i].output()))
            inputs.append(_input_sizes([ns[i]]))
            continue
        size = _sizes(_value_in(graphs[g], nodes[m], ns, master.inputsAt(0)))
        seen.append(size)
        inputs.append([tuple((d,)) for d in size] if size is not None else [])
    if any(s is None for s in seen):
        raise LoweringError(f"{master.kind()} at {_scope(master)}: the padded tensor has no sizes in a trace")
    columns = [tuple(c[0] for c in col) for col in zip(*inputs, strict=True)] if all(inputs) else []
    shape = fitter.shape(seen, columns, f"of the result of {master.kind()} at {_scope(master)}", None)
    return tuple(shape)


def _value_in(graph: Any, master: list[Any], nodes: list[Any], value: Any) -> Any:
    """``value`` of the example's trace, as the corresponding value of another trace."""
    producer = value.node()
    outputs = list(producer.outputs())
    if producer in master:
        return nodes[master.index(producer)].outputsAt(outputs.index(value))
    return list(graph.inputs())[list(producer.graph.inputs()).index(value)]


def _hints(copies: Sequence[Any], module: nn.Module | None) -> dict[int, Any]:
    """The op's own size rule per output dim, on its first input's sizes (``jit_size_rules``)."""
    rules = window_hints(copies, module)
    if not rules:
        return {}
    first = [_sizes(c.inputsAt(0)) for c in copies]
    if any(f is None for f in first):
        return {}
    return {d: (tuple(f[k] for f in first), form) for d, (k, form) in rules.items()}  # type: ignore[index]


def _input_sizes(copies: Sequence[Any]) -> list[tuple[int, ...]]:
    """Each dim of each tensor input of one node, as seen in every graph (a list built by
    ``prim::ListConstruct`` gives its tensors: ``cat``)."""
    per_graph = []
    for node in copies:
        sizes = []
        for v in node.inputs():
            items = list(v.node().inputs()) if v.node().kind() == "prim::ListConstruct" else [v]
            sizes += [_sizes(x) for x in items]
        per_graph.append(sizes)
    out: list[tuple[int, ...]] = []
    for k, first in enumerate(per_graph[0]):
        column = [g[k] if k < len(g) else None for g in per_graph]
        if first is None or any(c is None or len(c) != len(first) for c in column):
            continue
        out += [tuple(c[d] for c in column) for d in range(len(first))]  # type: ignore[index]
    return out


def _sizes(value: Any) -> list[int] | None:
    ty = value.type()
    if not isinstance(ty, torch._C.TensorType):
        return None
    sizes = ty.sizes()
    return list(sizes) if sizes is not None else None


def _scope(node: Any) -> str:
    scope = node.scopeName().split("/")[-1].removeprefix("__module.").removeprefix("__module")
    return scope or "<top level>"

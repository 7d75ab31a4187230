"""jit under dynamic axes: the graphs traced at every size point, compared node by node.

``torch.jit.trace`` records concrete sizes; tracing at several size assignments and fitting
each node's sizes (and each constant the tracer baked) to an expression in the symbols is how a
trace becomes symbolic (``torchlower/dynamic.py: Spec.fit``). A node that differs between the
traces is a branch on the size: that axis cannot be dynamic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from torchlower.core.dynamic import UNFIT, Spec, not_dynamic
from torchlower.core.values import Shape, SymDim


@dataclass
class JitOverrides:
    """Symbolic output shapes and fitted constants, by node index in the inlined graph."""

    shapes: dict[int, list[Shape | None]] = field(default_factory=dict)
    constants: dict[int, Any] = field(default_factory=dict)


def jit_overrides(spec: Spec, graphs: Sequence[Any]) -> JitOverrides:
    """Compare the inlined graphs traced at every point; sizes become expressions."""
    nodes = [list(g.nodes()) for g in graphs]
    out = JitOverrides()
    for i, node in enumerate(nodes[0]):
        kinds = [ns[i].kind() if i < len(ns) else None for ns in nodes]
        if any(k != node.kind() for k in kinds):
            moved = [p for p, k in zip(spec.points, kinds, strict=True) if k != node.kind()]
            symbols = [s for s in spec.base if any(p[s] != spec.base[s] for p in moved)]
            raise not_dynamic(
                spec,
                symbols or list(spec.base),
                f"the traced graph changes with it (the model branches on the size; first difference"
                f" at {_scope(node)}: {node.kind()} vs {next(k for k in kinds if k != node.kind())})",
            )
        if node.kind() == "prim::Constant":
            values = [ns[i].output().toIValue() for ns in nodes]
            fitted = spec.fit_value(values)
            if fitted is UNFIT:
                users = sorted({u.user.kind() for u in node.output().uses()})
                raise not_dynamic(
                    spec,
                    spec.changed(values),
                    f"a constant used by {', '.join(users)} at {_scope(node)}"
                    " was computed in Python from the size",
                )
            if fitted is not values[0]:
                out.constants[i] = fitted
            continue
        shapes: list[Shape | None] = []
        for j in range(len(list(node.outputs()))):
            seen = [_sizes(ns[i].outputsAt(j)) for ns in nodes]
            if seen[0] is None or any(s is None for s in seen):
                shapes.append(None)
                continue
            shapes.append(spec.fit_shape_of(seen, f"the result of {node.kind()} at {_scope(node)}"))
        if any(s is not None and any(isinstance(d, SymDim) for d in s) for s in shapes):
            out.shapes[i] = shapes
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

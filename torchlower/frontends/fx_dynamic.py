"""Dynamic axes for the FX front end: node shapes fitted over real runs at every size point.

An FX graph does not change with the input sizes (sizes are proxies while tracing), so the
graph is traced once and run at every point of the ``Spec``; each node's result shapes, seen
at all points, are fitted to integer expressions of the symbols and stored in ``node.meta``.
Python size arithmetic (``x.size(1) * 2``) is interpreted on ``SymDim``s and stays symbolic.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from torchlower.core.dynamic import Spec, not_dynamic
from torchlower.core.values import Shape
from torchlower.frontends.fx_trace import ShapePass
from torchlower.frontends.provenance import raised_at
from torchlower.rules.registry import Registry

SHAPES = "torchlower_shapes"  # node.meta key: fitted (symbolic) shape per tensor result


def fit_shapes(gm: fx.GraphModule, rules: Registry, spec: Spec, example: Sequence[torch.Tensor]) -> None:
    """Run ``gm`` at every point of ``spec`` and store symbolic result shapes where sizes move.

    The base point runs last, so the node metadata left behind (``tensor_meta``, the real
    inputs of calls lowered through ``torch.export``) is the example's.
    """
    order = [*range(1, len(spec.points)), 0]
    seen: dict[int, dict[str, list[tuple[int, ...] | None]]] = {}  # point index -> node -> shapes
    for k in order:
        point = spec.points[k]
        try:  # ShapeProp prints a traceback to stderr before raising: our error says it better
            with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):
                ShapePass(gm, rules).propagate(*spec.example_at(example, point))
        except Exception as exc:
            if k == spec.far:  # an extra witness only (the model's context may be shorter)
                continue
            moved = [s for s in spec.base if point[s] != spec.base[s]] or list(spec.base)
            cause = exc.__cause__ or exc
            first = str(cause).strip().splitlines()[0] if str(cause).strip() else repr(cause)
            node = re.search(r"node=%(\w+)", str(exc))
            where = f" in {node.group(1)}" if node else ""
            line = raised_at(cause)
            where += f" at {line}" if line else ""
            raise not_dynamic(spec, moved, f"the model fails at sizes {point}{where} ({first})") from exc
        seen[k] = {n.name: _leaf_shapes(n) for n in gm.graph.nodes}
    if spec.far is not None and spec.far not in seen:
        spec.drop_far()
    runs = [seen[k] for k in sorted(seen)]  # in the order of spec.points, the far point gone
    for n in gm.graph.nodes:
        observed = [run[n.name] for run in runs]
        if all(o == observed[0] for o in observed):
            continue
        n.meta[SHAPES] = [_fit_leaf(spec, n, [o[i] for o in observed]) for i in range(len(observed[0]))]


def meta_leaves(found: Any) -> list[Any]:
    """A node's recorded result(s) as a list: one ``TensorMetadata`` (a NamedTuple) is one leaf."""
    return list(found) if isinstance(found, (tuple, list)) and not hasattr(found, "shape") else [found]


def _leaf_shapes(n: fx.Node) -> list[tuple[int, ...] | None]:
    leaves = meta_leaves(n.meta.get("tensor_meta"))
    return [tuple(int(d) for d in leaf.shape) if hasattr(leaf, "shape") else None for leaf in leaves]


def _fit_leaf(spec: Spec, n: fx.Node, shapes: list[tuple[int, ...] | None]) -> Shape | None:
    if any(s is None for s in shapes):
        return None
    return spec.fit_shape_of(shapes, f"the result of {describe_node(n)}")  # type: ignore[arg-type]


def describe_node(n: fx.Node) -> str:
    """``conv1 (call_module)``, ``interpolate (call_function)`` — how a node is named in errors."""
    target = getattr(n.target, "__name__", n.target)
    return f"{target} at node {n.name!r}" if str(target) != n.name else f"{n.name} ({n.op})"


def symbolic_shapes(n: fx.Node) -> list[Any] | None:
    """The fitted shapes stored by ``fit_shapes`` (None where the node's sizes never move)."""
    return n.meta.get(SHAPES)


def output_metas(module: torch.nn.Module, example: Sequence[torch.Tensor], spec: Spec | None) -> list[Any]:
    """dtype/shape of a module-rule model's outputs, fitted over every size point when dynamic."""
    points = spec.points if spec is not None else [None]
    runs = []
    for point in points:
        args = example if point is None else spec.example_at(example, point)
        with torch.no_grad():
            runs.append(pytree.tree_leaves(module(*args)))
    metas = []
    for i, leaf in enumerate(runs[0]):
        if not isinstance(leaf, torch.Tensor):
            metas.append((None, None))
            continue
        shapes = [tuple(run[i].shape) for run in runs]
        shape = spec.fit_shape(shapes) if spec is not None else shapes[0]
        if shape is None:
            what = f"output {i} of {type(module).__name__} has sizes {shapes}"
            raise not_dynamic(spec, list(spec.base), what)
        metas.append((leaf.dtype, shape))
    return metas

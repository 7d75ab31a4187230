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
from torch.nn import functional as F
from torch.utils import _pytree as pytree

from torchlower.core.dynamic import Spec, not_dynamic
from torchlower.core.size_fit import SizeFitter
from torchlower.core.size_forms import window_form
from torchlower.core.values import Shape
from torchlower.frontends.fx_trace import ShapePass
from torchlower.frontends.provenance import raised_at
from torchlower.rules.registry import Registry

SHAPES = "torchlower_shapes"  # node.meta key: fitted (symbolic) shape per tensor result


def fit_shapes(gm: fx.GraphModule, rules: Registry, spec: Spec, example: Sequence[torch.Tensor]) -> None:
    """Run ``gm`` at every point of ``spec`` and store symbolic result shapes where sizes move.

    Each node's sizes are fitted from its inputs' sizes (``core/size_fit.py``); where the runs
    do not decide a size, the fitter names more sizes to run at. The base point runs last, so
    the node metadata left behind (``tensor_meta``, the real inputs of calls lowered through
    ``torch.export``) is the example's.
    """
    order = [*range(1, len(spec.points)), 0]
    seen: dict[int, dict[str, list[tuple[int, ...] | None]]] = {}  # point index -> node -> shapes
    for k in order:
        point = spec.points[k]
        try:
            seen[k] = _run(gm, rules, spec.example_at(example, point))
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
    if spec.far is not None and spec.far not in seen:
        spec.drop_far()
    runs = [seen[k] for k in sorted(seen)]  # in the order of spec.points, the far point gone
    fitter = SizeFitter(spec, "fx")
    while True:
        fitted = _fit_nodes(gm, fitter, runs)
        if fitter.complete():
            break
        extra = fitter.wanted()
        if not extra:
            raise fitter.unresolved()
        for point in extra:
            try:
                runs.append(_run(gm, rules, spec.example_at(example, point)))
            except Exception:  # a size the model refuses tells nothing: try others
                fitter.add(point, captured=False)
            else:
                fitter.add(point, captured=True)
    if fitter.extra:  # the node metadata of the example again
        _run(gm, rules, example)
    for n in gm.graph.nodes:
        if n.name in fitted:
            n.meta[SHAPES] = fitted[n.name]


def _run(
    gm: fx.GraphModule, rules: Registry, args: Sequence[torch.Tensor]
) -> dict[str, list[tuple[int, ...] | None]]:
    with torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):  # ShapeProp prints a traceback
        ShapePass(gm, rules).propagate(*args)
    return {n.name: _leaf_shapes(n) for n in gm.graph.nodes}


def _fit_nodes(gm: fx.GraphModule, fitter: SizeFitter, runs: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """One pass of the fitter over the graph: symbolic shapes by node name (where sizes move)."""
    fitter.begin()
    out: dict[str, list[Any]] = {}
    for n in gm.graph.nodes:
        observed = [run[n.name] for run in runs]
        if all(o == observed[0] for o in observed):
            continue
        inputs = []
        for m in n.all_input_nodes:
            for i in range(len(runs[0][m.name])):
                column = [run[m.name][i] for run in runs]
                if all(c is not None and len(c) == len(column[0]) for c in column):
                    inputs += [tuple(c[d] for c in column) for d in range(len(column[0]))]  # type: ignore[index]
        hints = _hints(gm, n, runs)
        out[n.name] = [
            _fit_leaf(fitter, n, [o[i] for o in observed], inputs, hints if i == 0 else None)
            for i in range(len(observed[0]))
        ]
    return out


def meta_leaves(found: Any) -> list[Any]:
    """A node's recorded result(s) as a list: one ``TensorMetadata`` (a NamedTuple) is one leaf."""
    return list(found) if isinstance(found, (tuple, list)) and not hasattr(found, "shape") else [found]


def _leaf_shapes(n: fx.Node) -> list[tuple[int, ...] | None]:
    leaves = meta_leaves(n.meta.get("tensor_meta"))
    return [tuple(int(d) for d in leaf.shape) if hasattr(leaf, "shape") else None for leaf in leaves]


def _fit_leaf(
    fitter: SizeFitter, n: fx.Node, shapes: list[tuple[int, ...] | None], inputs: list[Any], hints: Any
) -> Shape | None:
    if any(s is None for s in shapes):
        return None
    what = f"of the result of {describe_node(n)}"
    return fitter.shape(shapes, inputs, what, hints)  # type: ignore[arg-type,return-value]


_CONV_ARGS = ("input", "weight", "bias", "stride", "padding", "dilation")
_MAX_ARGS = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode")
_AVG_ARGS = ("input", "kernel_size", "stride", "padding", "ceil_mode")
_WINDOW_ARGS = {  # torch.nn.functional windows: their arguments in order
    fn: names
    for k in (1, 2, 3)
    for fn, names in (
        (getattr(F, f"conv{k}d"), _CONV_ARGS),
        (getattr(F, f"max_pool{k}d"), _MAX_ARGS),
        (getattr(F, f"avg_pool{k}d"), _AVG_ARGS),
    )
}


def _hints(gm: fx.GraphModule, n: fx.Node, runs: list[dict[str, Any]]) -> dict[int, Any]:
    """A window's own size rule (kernel, stride, padding) per output dim, on its input's sizes."""
    if not n.args or not isinstance(n.args[0], fx.Node):
        return {}
    if n.op == "call_module":
        rules = window_rules(gm.get_submodule(str(n.target)))
    elif n.op == "call_function" and n.target in _WINDOW_ARGS:
        rules = _function_rules(n, runs)
    elif n.op == "call_function" and n.target is torch.stft:
        return _stft_hint(n, runs)
    elif n.op == "call_method" and n.target == "unfold" and len(n.args) == 4 and len(runs[0][n.name]) == 1:
        _, dim, size, step = n.args
        rank = len(runs[0][n.args[0].name][0] or ())
        if not all(isinstance(v, int) for v in (dim, size, step)) or rank == 0:
            return {}
        first = [run[n.args[0].name][0] for run in runs]
        return {dim % rank: (tuple(f[dim % rank] for f in first), window_form(size, step, 0))}
    else:
        return {}
    first = [run[n.args[0].name][0] for run in runs]
    if not rules or any(f is None for f in first):
        return {}
    rank = len(first[0])
    return {
        rank - len(rules) + i: (tuple(f[rank - len(rules) + i] for f in first), form)
        for i, form in enumerate(rules)
    }


def _stft_hint(n: fx.Node, runs: list[dict[str, Any]]) -> dict[int, Any]:
    """``torch.stft``: (…, L) → (…, freq, frames), frames of ``n_fft`` every ``hop_length`` on
    the signal padded by ``n_fft // 2`` on each side when ``center``."""
    names = ("input", "n_fft", "hop_length", "win_length", "window", "center")
    given = {**dict(zip(names, n.args, strict=False)), **n.kwargs}
    n_fft, hop, center = given.get("n_fft"), given.get("hop_length"), given.get("center", True)
    if not isinstance(n_fft, int) or not isinstance(hop, (int, type(None))) or not isinstance(center, bool):
        return {}
    first = [run[n.args[0].name][0] for run in runs]  # type: ignore[union-attr]
    if any(f is None for f in first):
        return {}
    rank = len(first[0])
    form = window_form(n_fft, hop if hop is not None else n_fft // 4, n_fft // 2 if center else 0)
    return {rank: (tuple(f[rank - 1] for f in first), form)}


def _function_rules(n: fx.Node, runs: list[dict[str, Any]]) -> list[Any]:
    names = _WINDOW_ARGS[n.target]
    given = {**dict(zip(names, n.args, strict=False)), **n.kwargs}
    if given.get("ceil_mode", False) is not False or isinstance(given.get("padding", 0), str):
        return []
    if "weight" in given:
        weight = given["weight"]
        shape = runs[0][weight.name][0] if isinstance(weight, fx.Node) else None
        if shape is None:
            return []
        kernel: Any = tuple(shape[2:])
    else:
        kernel = given.get("kernel_size")
    k = len(kernel) if isinstance(kernel, (tuple, list)) else int(str(n.target.__name__)[-2])
    tup = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v,) * k  # noqa: E731
    stride = given.get("stride") or kernel if "kernel_size" in given else given.get("stride", 1)
    values = [tup(v) for v in (kernel, stride, given.get("padding", 0), given.get("dilation", 1))]
    if not all(isinstance(x, int) for v in values for x in v) or any(len(v) != k for v in values):
        return []
    return [window_form(*(v[i] for v in values)) for i in range(k)]


def window_rules(mod: torch.nn.Module) -> list[Any]:
    """Forms of the spatial dims of a ``nn.ConvNd`` / ``nn.MaxPoolNd`` / ``nn.AvgPoolNd``
    (integer padding, no ``ceil_mode``); empty for any other module."""
    conv = isinstance(mod, torch.nn.modules.conv._ConvNd) and not mod.transposed
    pool = isinstance(mod, (torch.nn.modules.pooling._MaxPoolNd, torch.nn.modules.pooling._AvgPoolNd))
    if not (conv or pool) or getattr(mod, "ceil_mode", False) or isinstance(mod.padding, str):
        return []
    n = len(mod.kernel_size) if isinstance(mod.kernel_size, tuple) else int(type(mod).__name__[-2])
    tup = lambda v: tuple(v) if isinstance(v, (tuple, list)) else (v,) * n  # noqa: E731
    kernel, stride, padding = tup(mod.kernel_size), tup(mod.stride or mod.kernel_size), tup(mod.padding)
    dilation = tup(getattr(mod, "dilation", 1))
    return [window_form(kernel[i], stride[i], padding[i], dilation[i]) for i in range(n)]


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
    fitter = SizeFitter(spec, "fx") if spec is not None else None
    moved = [spec.example_at(example, p) for p in points] if spec is not None else []
    inputs = [
        tuple(m[i].shape[d] for m in moved) for i in range(len(example)) for d in range(example[i].dim())
    ]
    metas = []
    for i, leaf in enumerate(runs[0]):
        if not isinstance(leaf, torch.Tensor):
            metas.append((None, None))
            continue
        shapes = [tuple(run[i].shape) for run in runs]
        if fitter is None:
            metas.append((leaf.dtype, shapes[0]))
            continue
        shape = fitter.shape(shapes, inputs, f"of output {i} of {type(module).__name__}")
        if not fitter.complete():
            raise fitter.unresolved()
        metas.append((leaf.dtype, shape))
    return metas

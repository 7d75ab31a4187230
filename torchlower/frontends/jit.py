"""The TorchScript front end: ``torch.jit.trace`` a module and walk its inlined graph.

``prim::`` structure (constants, lists, tuples, attribute reads) is resolved here in Python;
every ``aten::`` node becomes one rule call through the shared session.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torchlower.core import dynamic, dynamic_sizes, progress
from torchlower.core.dynamic import Spec
from torchlower.core.values import MISSING, SymDim, Value, constant
from torchlower.errors import (
    InvalidArgumentError,
    LoweringError,
    TorchlowerError,
    TraceError,
    ValueDependentTraceError,
)
from torchlower.frontends import jit_align, jit_script, jit_trace, provenance, views
from torchlower.frontends.jit_nodes import is_tensor, meta, normalize_args, scope_of, source_location
from torchlower.frontends.jit_trace import FastTrace, dynamic_overrides, maybe_quantize_args, trace
from torchlower.frontends.session import Session

OPT_IN = "allow_value_dependent_trace=True"


class ModuleTracer:
    """Trace ``module`` with ``torch.jit.trace`` (lazily, once) and expose its graph.

    A trace that took a Python value from a tensor computed from the inputs (``if x.sum() > 0``,
    ``.item()``, ``float(t)``, a loop count) raises ``TraceError`` naming the source lines,
    unless ``allow_value_dependent`` (then ``value_dependence`` lists them for the report).
    """

    def __init__(
        self,
        module: nn.Module,
        traced_module: torch.jit.TracedModule | None = None,
        fn_name: str = "forward",
        args: tuple[Any, ...] | None = None,
        allow_value_dependent: bool = False,
    ) -> None:
        self.mod = module  # kept to route whole-module rules by the original class
        self._traced_module = traced_module
        self.fn_name = fn_name
        self.args = maybe_quantize_args(module, args)
        self.allow_value_dependent = allow_value_dependent
        self.conversions: list[str] = []  # tracer warnings: a tensor became a Python value
        self.value_dependence: list[provenance.Conversion] = []  # accepted ones (opt-in)
        self._values_checked = False

    @property
    def traced_module(self) -> torch.jit.TracedModule:
        if self._traced_module is None:
            try:
                self._traced_module = trace(self.mod, self.fn_name, self.args, conversions=self.conversions)
            except TorchlowerError:
                raise
            except Exception as exc:  # RuntimeError, and TypeError for a traced size used as a bool
                line = provenance.raised_at(exc)
                raise TraceError(
                    f"torch.jit.trace failed on {type(self.mod).__qualname__}.{self.fn_name}"
                    f"{f' at {line}' if line else ''}: {type(exc).__name__}: "
                    f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}"
                ) from exc
            self.check_values()
        return self._traced_module

    def check_values(self) -> None:
        """Refuse a trace that depended on tensor values (see ``frontends/provenance.py``)."""
        if self._values_checked or not self.conversions or self.args is None:
            return
        self._values_checked = True
        found = provenance.value_conversions(self.mod, self.args, self.fn_name)
        if found is None:  # the eager witness failed: trust the tracer's warnings (conservative)
            found = [provenance.Conversion(w.split(": ", 1)[1], w.split(":")[0], int(w.split(":")[1]), "")
                     for w in self.conversions]  # fmt: skip
        if not found:
            return  # sizes only (int(x.shape[1]) under tracing): the trace is correct
        if not self.allow_value_dependent:
            raise ValueDependentTraceError(
                provenance.message(f"{type(self.mod).__qualname__}.{self.fn_name}", found, OPT_IN)
            )
        self.value_dependence = found

    def fast_trace(self) -> FastTrace | None:
        """The graph of ``forward`` traced without building a TracedModule, or None when that
        route would not lower to the same artifact (then the front end uses ``torch_graph``).

        ``torch.jit.trace`` spends most of its time turning the module tree into a
        ``TracedModule``; ``torch.jit._get_trace_graph`` records the same ops with the
        parameters and buffers as extra graph inputs, in ``state_dict`` order.
        """
        if self._traced_module is not None or self.fn_name != "forward" or self.args is None:
            return None
        fast = jit_trace.fast_trace(self.mod, self.args)
        if fast is not None:
            self.conversions += fast.conversions
            self.check_values()
        return fast

    @property
    def torch_graph(self) -> torch.Graph:
        if self.fn_name == "forward":
            return self.traced_module.graph
        return getattr(self.traced_module, self.fn_name).graph


@dataclass
class _ModuleRef:
    path: str
    module: Any


def lower_jit(
    builder: Any, tracer: ModuleTracer, inputs: Sequence[Value], session: Session, spec: Spec | None = None
) -> list[Any]:
    """Walk the inlined graph, lowering every node; returns the flattened outputs.

    With dynamic axes (``spec``) the module is traced again at other sizes and node shapes and
    size constants become expressions in the symbols (``torchlower.core.dynamic``); those traces
    are compared node by node, so they all take the full ``torch.jit.trace`` route.
    """
    fast = tracer.fast_trace() if spec is None else None
    env: dict[Any, Any] = {}
    dyn = None
    if fast is not None:  # parameters and buffers arrive as trailing graph inputs
        graph = fast.graph
        torch._C._jit_pass_inline(graph)  # @torch.jit.script_if_tracing helpers are calls in a trace
        graph_inputs = list(graph.inputs())
        tensor_inputs = graph_inputs[: len(graph_inputs) - len(fast.state)]
        for value, (key, tensor) in zip(graph_inputs[len(tensor_inputs) :], fast.state, strict=True):
            env[value] = constant(tensor, label=key)
    else:
        graph = tracer.torch_graph.copy()
        torch._C._jit_pass_inline(graph)
        dyn = dynamic_overrides(tracer.mod, tracer.fn_name, tracer.args or (), graph, spec) if spec else None
        if dyn is not None and dyn.graph is not None:  # a trace holding a pad/slice the example's lacks
            graph = dyn.graph
        graph_inputs = list(graph.inputs())
        env[graph_inputs[0]] = _ModuleRef("", tracer.mod)
        tensor_inputs = graph_inputs[1:]
    progress.retotal(sum(n.kind().startswith("aten::") for n in graph.nodes()), "lowering")
    if isinstance(tracer.mod, torch.jit.ScriptModule) and len(tensor_inputs) > len(inputs):
        rest = jit_script.defaults(tracer, len(inputs))
        for value, default in zip(tensor_inputs[len(inputs) :], rest, strict=True):
            env[value] = constant(default) if isinstance(default, torch.Tensor) else default
        tensor_inputs = tensor_inputs[: len(inputs)]
    if len(tensor_inputs) != len(inputs):
        raise InvalidArgumentError(
            f"the traced graph takes {len(tensor_inputs)} tensor inputs, {len(inputs)} were given"
        )
    env.update(zip(tensor_inputs, inputs, strict=True))

    def walk(nodes: Any, env: dict[Any, Any], top: bool = False) -> None:
        for index, node in enumerate(nodes):
            _step(node, env, session, walk, dyn if top else None, index)

    walk(graph.nodes(), env, top=True)
    returned = [env[v] for v in graph.return_node().inputs()]
    return _flatten(returned[0] if len(returned) == 1 else returned)


def _step(
    node: torch._C.Node, env: dict[Any, Any], session: Session, walk: Any, dyn: Any, index: int
) -> None:
    """Lower one node into ``env``; a scripted ``prim::If`` / ``prim::Loop`` runs its blocks."""
    outputs = list(node.outputs())
    if dyn is not None and index in dyn.constants:
        env[outputs[0]] = dyn.constants[index]
        return
    if node.kind() in ("prim::If", "prim::Loop"):
        where = source_location(node, scope_of(node)) or scope_of(node) or "<top level>"
        if dyn is not None:
            raise LoweringError(f"{node.kind()} at {where}: scripted control flow with dynamic axes")
        run = jit_script.run_if if node.kind() == "prim::If" else jit_script.run_loop
        env.update(zip(outputs, run(node, env, walk, where), strict=True))
        return
    shapes = dyn.shapes.get(index) if dyn is not None else None
    args = [env[i] for i in node.inputs()]
    if dyn is not None and index in dyn.resized:  # a pad/slice some traces lack: sized by the fit
        args = jit_align.resized(node.kind(), args, dyn.resized[index], scope_of(node) or "<top level>")
        shapes = [dyn.resized[index]]
    results = _lower_node(node, args, session, shapes)
    if len(outputs) == 1 and node.kind() in _UNPACK and results is not MISSING:
        results = results[0]  # unpacking a one-element list (split into one chunk)
    if len(outputs) == 1:
        env[outputs[0]] = results
        if _is_inplace(node.kind()):
            _write_through(node, env, results, session)
    else:
        if results is MISSING:
            results = [MISSING] * len(outputs)
        env.update(zip(outputs, results, strict=True))


_UNPACK = ("prim::ListUnpack", "prim::TupleUnpack")
_SIZE_READS = ("aten::Int", "aten::ScalarImplicit")


def _lower_node(
    node: torch._C.Node, args: list[Any], session: Session, shapes: list[Any] | None = None
) -> Any:
    kind = node.kind()
    where = scope_of(node)
    session.location = source_location(node, where)
    if kind == "prim::Constant":
        value = node.output().toIValue()
        return constant(value, name="const") if isinstance(value, torch.Tensor) else value
    if kind == "prim::GetAttr":
        return _get_attr(args[0], node.s("name"))
    if kind == "prim::ListConstruct":
        return list(args)
    if kind == "prim::TupleConstruct":
        return tuple(args)
    if kind == "prim::DictConstruct":  # a dict output (HF ModelOutput with return_dict=True)
        return dict(zip(args[0::2], args[1::2], strict=True))
    if kind in _UNPACK:
        return list(args[0]) if args[0] is not MISSING else MISSING
    if kind == "prim::TupleIndex":
        return args[0][args[1]]
    if kind == "prim::NumToTensor":
        return constant(torch.tensor(args[0])) if isinstance(args[0], (int, float, bool)) else args[0]
    if kind in ("aten::Int", "aten::Float", "aten::ScalarImplicit", "aten::Bool"):
        x = args[0]
        if isinstance(x, Value) and x.is_const:
            return x.const.item()
        if isinstance(x, Value) and x.size_value is not None and kind in _SIZE_READS:
            return x.size_value  # a size that went through a tensor (an element of an arange)
        return x
    scripted = jit_script.python_op(node, args, session.location or where or "<top level>")
    if scripted is not NotImplemented:
        return scripted
    if kind.startswith("prim::") and kind not in ("prim::device", "prim::dtype"):
        session.record_missing(kind, where)
        return MISSING
    sized = dynamic_sizes.scalar_op(kind.split("::")[-1], args)
    if sized is not NotImplemented:  # integer math on symbolic sizes stays symbolic
        return sized
    args = [
        dynamic.materialize(session.builder, a) if isinstance(a, SymDim) and is_tensor(v) else a
        for a, v in zip(args, node.inputs(), strict=True)
    ]
    schema = node.schema() if kind.startswith("aten::") else ""
    key = schema.split("(", 1)[0] if schema and schema != "(no schema)" else kind
    args = normalize_args(schema, args)
    metas = [meta(o) for o in node.outputs()]
    if shapes is not None:
        metas = [(m[0], s if s is not None else m[1]) for m, s in zip(metas, shapes, strict=True)]
    fold = _folder(kind, schema)
    return session.apply(key, args, where, metas, fold)


_VIEW_OPS = {
    f"aten::{op}"
    for op in [
        "slice",
        "select",
        "narrow",
        "view",
        "view_as",
        "reshape_as",
        "reshape",
        "expand",
        "expand_as",
        "unsqueeze",
        "squeeze",
        "transpose",
        "permute",
        "t",
        "as_strided",
        "diagonal",
        "unfold",
        "split",
        "chunk",
        "unbind",
        "flatten",
        "unflatten",
        "movedim",
        "alias",
        "detach",
    ]
}


def _write_through(node: torch._C.Node, env: dict[Any, Any], result: Any, session: Session) -> None:
    """Later readers of a tensor written in place (``y[i] = v``, ``y[:, 2].zero_()``) see the write.

    A write into a view is scattered back through each view op up to the tensor that owns the
    storage (``views.write_back``); that tensor is rebound, and the views of it taken earlier
    (identity views such as ``y[:]`` included) are recomputed. A write through a view with no
    inverse (expand, unfold, split…) into a tensor read later is refused.
    """
    value, new = next(iter(node.inputs())), result
    while _is_view(value, env):
        producer, op = value.node(), views.op_name(value.node().kind())
        base = next(iter(producer.inputs()))
        args = normalize_args(producer.schema(), [env[i] for i in producer.inputs()])[1:]
        new = views.write_back(session, scope_of(producer), env[base], op, args, new)
        value = base
    producer = value.node()
    if producer.kind() in _VIEW_OPS or producer.kind() == "prim::ListUnpack":
        base = next(iter(producer.inputs()))
        if any(u.user.isAfter(node) for u in base.uses()):
            raise LoweringError(
                f"in-place {node.kind()} at {scope_of(node) or '<top level>'} writes through a view "
                f"({producer.kind()}) into a tensor read later, and that view has no functional "
                "inverse; write into the tensor itself instead"
            )
    old, env[value] = env[value], new  # not the same-named values: ``clone`` lowers to its input
    _refresh_views(value, old, node, env, session)


def _is_view(value: torch._C.Value, env: dict[Any, Any]) -> bool:
    """Whether ``value`` aliases the first input of the node that made it (views.aliases)."""
    producer = value.node()
    if not producer.kind().startswith("aten::") or value not in env:
        return False
    base = next(iter(producer.inputs()), None)
    return base is not None and views.aliases(views.op_name(producer.kind()), env[value], env.get(base))


def _refresh_views(
    root: torch._C.Value, old_root: Any, node: torch._C.Node, env: dict[Any, Any], session: Session
) -> None:
    """Recompute the views of ``root`` (and views of those) taken before ``node`` wrote into it;
    earlier in-place results on them are aliases and take the new value. Whether an aliasing op
    (``to``, ``contiguous``) was a view is decided on the values from before the write."""
    stack = [(root, old_root)]
    while stack:
        value, old_value = stack.pop()
        for use in value.uses():
            user = use.user
            if use.offset != 0 or user is node or user.isAfter(node) or len(list(user.outputs())) != 1:
                continue
            out = user.output()
            previous = env.get(out)
            aliasing = user.kind().startswith("aten::") and views.op_name(user.kind()) in views.ALIASING
            if user.kind() in _VIEW_OPS or (aliasing and views.aliases("to", previous, old_value)):
                env[out] = _lower_node(user, [env[i] for i in user.inputs()], session)
            elif _is_inplace(user.kind()):
                env[out] = env[next(iter(user.inputs()))]
            else:
                continue
            stack.append((out, previous))


def _is_inplace(kind: str) -> bool:
    """``aten::index_put_`` and friends mutate their first input (``__iand__``-style names excluded)."""
    return kind.startswith("aten::") and kind.endswith("_") and not kind.endswith("__")


def _folder(kind: str, schema: str) -> Any:
    """The torch op that folds a node; keyword-only schema args (dtype, device…) go by name."""
    packet = getattr(torch.ops.aten, kind.split("::", 1)[1], None) if kind.startswith("aten::") else None
    if packet is None or not schema or schema == "(no schema)":
        return packet
    kwonly = [a.name for a in torch._C.parse_schema(schema).arguments if a.kwarg_only]
    if not kwonly:
        return packet

    def fold(*args: Any) -> Any:
        n = len(args) - len(kwonly)
        return packet(*args[:n], **dict(zip(kwonly, args[n:], strict=True)))

    return fold


def _get_attr(owner: Any, name: str) -> Any:
    if not isinstance(owner, _ModuleRef):
        raise TraceError(f"attribute {name!r} read from a non-module value {owner!r}")
    item = getattr(owner.module, name)
    path = f"{owner.path}.{name}" if owner.path else name
    if isinstance(item, torch.Tensor):
        return constant(item, label=path)
    if isinstance(item, nn.Module):
        return _ModuleRef(path, item)
    return item


def _flatten(item: Any) -> list[Any]:
    if isinstance(item, dict):  # in insertion order, as torch's pytree flattens the model output
        return [leaf for sub in item.values() for leaf in _flatten(sub)]
    if isinstance(item, (list, tuple)):
        return [leaf for sub in item for leaf in _flatten(sub)]
    return [item]

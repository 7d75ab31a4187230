"""The TorchScript front end: ``torch.jit.trace`` a module and walk its inlined graph.

``prim::`` structure (constants, lists, tuples, attribute reads) is resolved here in Python;
every ``aten::`` node becomes one rule call through the shared session.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchlower import dynamic, progress
from torchlower.dynamic import Spec
from torchlower.errors import InvalidArgumentError, LoweringError, TraceError
from torchlower.frontends.session import MISSING, Meta, Session
from torchlower.values import SymDim, Value, constant

_SCALAR_TYPES = {
    "Float": torch.float32, "Double": torch.float64, "Half": torch.float16,
    "BFloat16": torch.bfloat16, "Long": torch.int64, "Int": torch.int32, "Short": torch.int16,
    "Char": torch.int8, "Byte": torch.uint8, "Bool": torch.bool,
}  # fmt: skip
# ScalarType enum values, as traced graphs store dtype arguments
_DTYPE_OF_CODE = {
    0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64,
    5: torch.float16, 6: torch.float32, 7: torch.float64, 11: torch.bool, 15: torch.bfloat16,
}  # fmt: skip


def _is_quantized_input_module(module: nn.Module) -> bool:
    """True when the first compute layer is a quantized conv/linear (expects quantized input)."""
    for sub in module.modules():
        if type(sub).__name__ == "Quantize":  # a QuantStub converted: it quantizes the input itself
            return False
        kind = type(sub).__module__
        if kind.startswith("torch.ao.nn.quantized") and type(sub).__name__ in {
            "Conv1d", "Conv2d", "Conv3d", "Linear", "ConvTranspose1d", "ConvTranspose2d",
        }:  # fmt: skip
            return True
        if isinstance(sub, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)):
            return False
    return False


def maybe_quantize_args(module: nn.Module, args: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
    """Quantize float tensor args when ``module`` expects quantized input.

    Only to make tracing work: the scale (1.0) and zero point (0) are dummies and the
    quantized values are not representative of real data.
    """
    if args is None or not _is_quantized_input_module(module):
        return args
    return tuple(
        torch.quantize_per_tensor(a, 1.0, 0, torch.quint8)
        if isinstance(a, torch.Tensor) and a.is_floating_point() and not a.is_quantized
        else a
        for a in args
    )


class ModuleTracer:
    """Trace ``module`` with ``torch.jit.trace`` (lazily, once) and expose its graph."""

    def __init__(
        self,
        module: nn.Module,
        traced_module: torch.jit.TracedModule | None = None,
        fn_name: str = "forward",
        args: tuple[Any, ...] | None = None,
    ) -> None:
        self.mod = module  # kept to route whole-module rules by the original class
        self._traced_module = traced_module
        self.fn_name = fn_name
        self.args = maybe_quantize_args(module, args)

    @property
    def traced_module(self) -> torch.jit.TracedModule:
        if self._traced_module is None:
            try:
                self._traced_module = _trace(self.mod, self.fn_name, self.args)
            except RuntimeError as exc:
                raise TraceError(
                    f"torch.jit.trace failed on {type(self.mod).__qualname__}.{self.fn_name}: "
                    f"{str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r}"
                ) from exc
        return self._traced_module

    def fast_trace(self) -> FastTrace | None:
        """The graph of ``forward`` traced without building a TracedModule, or None when that
        route would not lower to the same artifact (then the front end uses ``torch_graph``).

        ``torch.jit.trace`` spends most of its time turning the module tree into a
        ``TracedModule``; ``torch.jit._get_trace_graph`` records the same ops with the
        parameters and buffers as extra graph inputs, in ``state_dict`` order.
        """
        if self._traced_module is not None or self.fn_name != "forward" or self.args is None:
            return None
        return _fast_trace(self.mod, self.args)

    @property
    def torch_graph(self) -> torch.Graph:
        if self.fn_name == "forward":
            return self.traced_module.graph
        return getattr(self.traced_module, self.fn_name).graph


def _trace(
    module: nn.Module, fn_name: str, args: tuple[Any, ...] | None, python_values: set[str] | None = None
) -> Any:
    """``torch.jit.trace``; ``python_values`` collects where the model turned a tensor (or a
    size) into a Python value, which the trace then holds as a constant (``file.py:12``)."""
    inputs = () if args is None else args
    options: dict[str, Any] = {"check_trace": False}
    if "strict" in torch.jit.trace.__code__.co_varnames:
        options["strict"] = False
    with warnings.catch_warnings(record=True) as caught:  # jit.trace is deprecated upstream
        warnings.simplefilter("always", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        if fn_name == "forward":
            traced = torch.jit.trace(module, inputs, **options)
        else:
            traced = torch.jit.trace_module(module, {fn_name: inputs}, **options)
    for w in caught:  # the model's own warnings still reach the user
        if not issubclass(w.category, torch.jit.TracerWarning):
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if python_values is not None:
        python_values |= {
            f"{Path(w.filename).name}:{w.lineno}"
            for w in caught
            if issubclass(w.category, torch.jit.TracerWarning)
        }
    return traced


@dataclass
class FastTrace:
    graph: torch.Graph
    state: list[tuple[str, torch.Tensor]]  # (state_dict key, tensor) of the trailing graph inputs


def _fast_trace(module: nn.Module, args: tuple[Any, ...]) -> FastTrace | None:
    """Trace with ``_get_trace_graph`` where it is equivalent to ``torch.jit.trace``; else None.

    Equivalent means: plain (not scripted, not quantized) module and tensor inputs, every
    parameter and buffer in the state dict exactly once (tied or non-persistent tensors would
    get other labels), and outputs that are tensors in (nested) tuples or lists.
    """
    if isinstance(module, torch.jit.ScriptModule) or not all(
        isinstance(a, torch.Tensor) and not a.is_quantized for a in args
    ):
        return None
    state = torch.jit._unique_state_dict(module, keep_vars=True)
    held = [t for _, t in module.named_parameters(remove_duplicate=False)]
    held += [t for _, t in module.named_buffers(remove_duplicate=False)]
    if len(state) != len(held) or {id(t) for t in state.values()} != {id(t) for t in held}:
        return None
    if any(t.is_quantized for t in held):
        return None
    scopes: dict[Any, str] = {"__module": module}
    for name, child in module.named_modules(remove_duplicate=False):
        if name:
            scopes[child] = f"__module.{name}"  # last name wins, as in torch.jit.trace_module
    old = torch.jit._trace._trace_module_map
    torch.jit._trace._trace_module_map = scopes  # scope names, as torch.jit.trace records them
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
            graph, out = torch.jit._get_trace_graph(module, args, strict=False)
    except (RuntimeError, TypeError, ValueError):
        return None  # the full route reports the failure with its own message
    finally:
        torch.jit._trace._trace_module_map = old
    if not _tensor_tree(out) or len(list(graph.inputs())) != len(args) + len(state):
        return None
    return FastTrace(graph, list(state.items()))


def _tensor_tree(item: Any) -> bool:
    if isinstance(item, (tuple, list)):
        return all(_tensor_tree(i) for i in item)
    return isinstance(item, torch.Tensor)


@dataclass
class _ModuleRef:
    path: str
    module: Any


def lower_jit(
    builder: Any, tracer: ModuleTracer, inputs: Sequence[Value], session: Session, spec: Spec | None = None
) -> list[Any]:
    """Walk the inlined graph, lowering every node; returns the flattened outputs.

    With dynamic axes (``spec``) the module is traced again at other sizes and node shapes and
    size constants become expressions in the symbols (``torchlower.dynamic``); those traces
    are compared node by node, so they all take the full ``torch.jit.trace`` route.
    """
    fast = tracer.fast_trace() if spec is None else None
    env: dict[Any, Any] = {}
    dyn = None
    if fast is not None:  # parameters and buffers arrive as trailing graph inputs
        graph = fast.graph
        graph_inputs = list(graph.inputs())
        tensor_inputs = graph_inputs[: len(graph_inputs) - len(fast.state)]
        for value, (key, tensor) in zip(graph_inputs[len(tensor_inputs) :], fast.state, strict=True):
            env[value] = constant(tensor, label=key)
    else:
        graph = tracer.torch_graph.copy()
        torch._C._jit_pass_inline(graph)
        graph_inputs = list(graph.inputs())
        env[graph_inputs[0]] = _ModuleRef("", tracer.mod)
        tensor_inputs = graph_inputs[1:]
        dyn = _dynamic_overrides(tracer, graph, spec) if spec is not None else None
    progress.retotal(sum(n.kind().startswith("aten::") for n in graph.nodes()), "lowering")
    if len(tensor_inputs) != len(inputs):
        raise InvalidArgumentError(
            f"the traced graph takes {len(tensor_inputs)} tensor inputs, {len(inputs)} were given"
        )
    env.update(zip(tensor_inputs, inputs, strict=True))
    for index, node in enumerate(graph.nodes()):
        outputs = list(node.outputs())
        if dyn is not None and index in dyn.constants:
            env[outputs[0]] = dyn.constants[index]
            continue
        shapes = dyn.shapes.get(index) if dyn is not None else None
        results = _lower_node(node, [env[i] for i in node.inputs()], session, shapes)
        if len(outputs) == 1 and node.kind() in _UNPACK and results is not MISSING:
            results = results[0]  # unpacking a one-element list (split into one chunk)
        if len(outputs) == 1:
            env[outputs[0]] = results
            if _is_inplace(node.kind()):
                _rebind_inplace(node, env, results)
        else:
            if results is MISSING:
                results = [MISSING] * len(outputs)
            env.update(zip(outputs, results, strict=True))
    returned = [env[v] for v in graph.return_node().inputs()]
    return _flatten(returned[0] if len(returned) == 1 else returned)


def _dynamic_overrides(tracer: ModuleTracer, graph: torch.Graph, spec: Spec) -> dynamic.JitOverrides:
    """Trace at every other point of ``spec``; the graphs' differences become symbols."""
    graphs = [graph]
    python_values: set[str] = set()
    for point in spec.points[1:]:
        args = maybe_quantize_args(tracer.mod, spec.example_at(tracer.args or (), point))
        try:
            traced = _trace(tracer.mod, tracer.fn_name, args, python_values)
        except RuntimeError as exc:
            raise dynamic.not_dynamic(
                spec,
                [s for s in spec.base if point[s] != spec.base[s]],
                f"tracing at sizes {point} failed"
                f" ({str(exc).strip().splitlines()[0] if str(exc).strip() else exc!r})",
            ) from exc
        fn = traced if tracer.fn_name == "forward" else getattr(traced, tracer.fn_name)
        other = fn.graph.copy()
        torch._C._jit_pass_inline(other)
        graphs.append(other)
    try:
        return dynamic.jit_overrides(spec, graphs)
    except LoweringError as exc:
        if not python_values:
            raise
        where = ", ".join(sorted(python_values))
        raise LoweringError(
            f"{exc}. The model turned a tensor or size into a Python value at {where}"
        ) from exc


_UNPACK = ("prim::ListUnpack", "prim::TupleUnpack")


def _lower_node(
    node: torch._C.Node, args: list[Any], session: Session, shapes: list[Any] | None = None
) -> Any:
    kind = node.kind()
    where = _scope(node)
    if kind == "prim::Constant":
        value = node.output().toIValue()
        return constant(value, name="const") if isinstance(value, torch.Tensor) else value
    if kind == "prim::GetAttr":
        return _get_attr(args[0], node.s("name"))
    if kind == "prim::ListConstruct":
        return list(args)
    if kind == "prim::TupleConstruct":
        return tuple(args)
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
        return x
    if kind.startswith("prim::") and kind not in ("prim::device", "prim::dtype"):
        session.record_missing(kind, where)
        return MISSING
    sized = dynamic.scalar_op(kind.split("::")[-1], args)
    if sized is not NotImplemented:  # integer math on symbolic sizes stays symbolic
        return sized
    args = [
        dynamic.materialize(session.builder, a) if isinstance(a, SymDim) and _is_tensor(v) else a
        for a, v in zip(args, node.inputs(), strict=True)
    ]
    schema = node.schema() if kind.startswith("aten::") else ""
    key = schema.split("(", 1)[0] if schema and schema != "(no schema)" else kind
    args = _normalize_args(schema, args)
    metas = [_meta(o) for o in node.outputs()]
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


def _rebind_inplace(node: torch._C.Node, env: dict[Any, Any], result: Any) -> None:
    """Later uses of a tensor mutated in place (``y[i] = v``) see the new value.

    Every alias with the same graph name (identity views such as ``y[:]``) is rebound; a write
    through a real view into a tensor that is read afterwards cannot be expressed: refuse it.
    """
    target = next(iter(node.inputs()))
    old = env[target]
    env[target] = result
    if isinstance(old, Value):  # constants share placeholder names ("const"): match them by identity
        for key, value in list(env.items()):
            if isinstance(value, Value) and (value is old if old.is_const else value.name == old.name):
                env[key] = result
    producer = target.node()
    if producer.kind() in _VIEW_OPS:
        base = next(iter(producer.inputs()))
        if env.get(base) is not result and any(u.user.isAfter(node) for u in base.uses()):
            raise LoweringError(
                f"in-place {node.kind()} at {_scope(node) or '<top level>'} writes through a view "
                f"({producer.kind()}) into a tensor read later; write into the tensor itself instead"
            )


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


def _is_tensor(value: torch._C.Value) -> bool:
    return isinstance(value.type(), torch._C.TensorType)


def _meta(output: torch._C.Value) -> Meta:
    ty = output.type()
    if not isinstance(ty, torch._C.TensorType):
        return (None, None)
    sizes = ty.sizes()
    return _SCALAR_TYPES.get(ty.scalarType() or ""), tuple(sizes) if sizes is not None else None


_ARG_TYPE = re.compile(r"^\s*([A-Za-z]+)")


def _normalize_args(schema: str, args: list[Any]) -> list[Any]:
    """Turn ScalarType ints into torch dtypes, using the node's schema."""
    if not schema or "ScalarType" not in schema:
        return args
    params = schema.split("(", 1)[1].rsplit(") ->", 1)[0]
    types = [m.group(1) if (m := _ARG_TYPE.match(p)) else "" for p in _split_params(params)]
    return [
        _DTYPE_OF_CODE.get(a, a) if t == "ScalarType" and isinstance(a, int) else a
        for t, a in zip(types, args, strict=False)
    ]


def _split_params(params: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in params:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p for p in (p.strip() for p in parts) if p and p != "*"]


def _scope(node: torch._C.Node) -> str:
    """``__module.features/__module.features.0`` → ``features.0``."""
    scope = node.scopeName().split("/")[-1]
    return scope.removeprefix("__module.").removeprefix("__module")


def _flatten(item: Any) -> list[Any]:
    if isinstance(item, (list, tuple)):
        return [leaf for sub in item for leaf in _flatten(sub)]
    return [item]

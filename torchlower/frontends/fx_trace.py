"""FX tracing for the FX front end: ``Tracer``, ``trace`` and the shape pass.

``Tracer`` keeps what has a rule whole, expands ``forward(self, *xs)`` when the number of inputs
is known, and leaves ``torch.nn`` modules that FX cannot trace as leaves; ``ShapePass`` records
shapes and, for calls the interpreter will hand to ``torch.export``, their real inputs.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import operator
import types
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import fx, nn
from torch.fx.passes.shape_prop import ShapeProp
from torch.utils import _pytree as pytree

from torchlower.core.values import Value
from torchlower.errors import TorchlowerError, TraceError
from torchlower.frontends import pycalls
from torchlower.frontends.autograd_inline import functions_inlined
from torchlower.frontends.provenance import raised_at
from torchlower.rules.registry import Registry

EXAMPLE = "torchlower_example"  # node.meta key: real inputs of a call lowered through torch.export


class Tracer(fx.Tracer):
    """Keeps modules with a module rule (by MRO) as leaves and wraps functions that have rules.

    Other modules are traced through; a ``torch.nn`` module whose ``forward`` cannot be traced
    symbolically (control flow on shapes, Python-only functionals) stays a leaf and is lowered
    through ``torch.export`` of that module alone.
    """

    def __init__(
        self,
        rules: Registry | None = None,
        autowrap_functions: Sequence[Any] = (),
        example: Sequence[Any] | None = None,
        leaves: frozenset[int] = frozenset(),
    ) -> None:
        from torchlower.rules import NNEF_RULES

        self.rules = rules if rules is not None else NNEF_RULES
        self.rules.ensure_loaded()
        wrapped = [k for k in self.rules.functions if isinstance(k, types.FunctionType)]
        super().__init__((math,), tuple(autowrap_functions) + tuple(wrapped))
        self.record_stack_traces = True  # node.meta["stack_trace"]: errors name the model's line
        self._traceable: dict[int, bool] = {}
        self.example = example  # real inputs, when known: ``forward(self, *xs)``, ``a, b = f(x)``
        self._values: dict[fx.Node, Any] = {}
        self.leaves = leaves  # ids of modules a previous attempt could not trace into

    def proxy(self, node: fx.Node) -> fx.Proxy:
        return _Proxy(node, self)

    def iter(self, obj: fx.Proxy) -> Any:
        """``a, b = torch.var_mean(x)``, ``for t in x.split(2)``: as many items as the real run has."""
        value = self._evaluate(obj.node) if self.example is not None else None
        if not isinstance(value, (tuple, list, torch.Tensor)) or isinstance(value, torch.Size):
            return super().iter(obj)
        return iter([obj[i] for i in range(len(value))])

    def _evaluate(self, node: fx.Node) -> Any:
        """The node's value in a real run on ``example`` (only what ``iter`` asks for is computed)."""
        if node not in self._values:
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), self._evaluate)
            if node.op == "placeholder":
                index = [n for n in node.graph.nodes if n.op == "placeholder"].index(node)
                value = self.example[index]  # type: ignore[index]
                value = value.clone() if isinstance(value, torch.Tensor) else value  # setitem mutates
            elif node.op == "get_attr":
                value = fx.graph_module._get_attr(self.root, node.target)  # type: ignore[arg-type]
            elif node.op == "call_module":
                value = self.root.get_submodule(node.target)(*args, **kwargs)  # type: ignore[arg-type]
            elif node.op == "call_method":
                value = getattr(args[0], node.target)(*args[1:], **kwargs)  # type: ignore[arg-type]
            else:
                value = node.target(*args, **kwargs)  # type: ignore[operator]
            self._values[node] = value
        return self._values[node]

    def create_args_for_root(self, root_fn: Any, is_module: bool, concrete_args: Any = None) -> Any:
        """One placeholder per input for ``forward(self, *xs)`` (FX alone gives one for ``xs``)."""
        n_inputs = len(self.example) if self.example is not None else None
        placeholders = _vararg_placeholders(root_fn, is_module, n_inputs) if not concrete_args else None
        if placeholders is None:
            return super().create_args_for_root(root_fn, is_module, concrete_args)
        proxies = [self.create_proxy("placeholder", name, (), {}) for name in placeholders]
        return root_fn, ([self.root] if is_module else []) + proxies

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        if self.rules.lookup_module(type(m)) is not None or id(m) in self.leaves:
            return True
        if not super().is_leaf_module(m, module_qualified_name):
            return False
        if id(m) not in self._traceable:
            self._traceable[id(m)] = _traces_into_known_calls(m)
        return not self._traceable[id(m)]


def _vararg_placeholders(root_fn: Any, is_module: bool, n_inputs: int | None) -> list[str] | None:
    """Placeholder names ``a, b, xs_0, xs_1`` when ``root_fn`` takes ``*xs`` and ``n_inputs`` is known."""
    if n_inputs is None:
        return None
    params = list(inspect.signature(inspect.unwrap(root_fn)).parameters.values())[int(is_module) :]
    if not any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    fixed = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required_kw = [p for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty]
    if n_inputs < len(fixed) or required_kw:
        return None  # defaults or keyword-only inputs: FX's own handling (it fails with a clear message)
    star = next(p.name for p in params if p.kind is p.VAR_POSITIONAL)
    return fixed + [f"{star}_{i}" for i in range(n_inputs - len(fixed))]


def _defaulted(model: nn.Module, example: Sequence[Any] | None) -> dict[str, Any] | None:
    """Parameters after the given inputs keep their defaults (``forward(x, y=None)`` on one input)."""
    if example is None:
        return None
    params = list(inspect.signature(model.forward).parameters.values())
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    rest = [p for p in params[len(example) :] if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    found = {p.name: p.default for p in rest if p.default is not p.empty}
    return found or None


# calls the interpreter lowers itself whatever their sizes (``fx_interpolate``), so a ``torch.nn``
# module made of them (``nn.Upsample``) is traced into: kept whole, torch.export refused an FPN
# level's ``(H + 1)/2`` as a Dim
_LOWERED_BY_INTERPRETER = (torch.nn.functional.interpolate,)


def _traces_into_known_calls(module: nn.Module) -> bool:
    try:
        graph = fx.Tracer().trace(module)
    except Exception:  # any failure means: keep it whole
        return False
    calls = [n.target for n in graph.nodes if n.op == "call_function"]
    return all(pycalls.resolvable(t) or t in _LOWERED_BY_INTERPRETER for t in calls)


def trace(
    model: nn.Module, rules: Registry | None = None, example: Sequence[Any] | None = None
) -> fx.GraphModule:
    """``model`` as a ``GraphModule`` traced with ``Tracer`` (``example``: the real inputs, if known).

    A submodule FX cannot trace into (torch-geometric's ``MessagePassing`` checks
    ``isinstance(edge_index, Tensor)``, which a proxy is not) is kept whole on the next attempt
    and lowered through ``torch.export`` of that module alone, as ``torch.nn`` leaves are;
    ``gm.meta[LEAVES]`` lists them with FX's reason. The model itself failing is a ``TraceError``.
    """
    leaves: dict[int, str] = {}
    while True:
        tracer = Tracer(rules, example=example, leaves=frozenset(leaves))
        try:
            with torch.no_grad(), _packed_sizes(), functions_inlined():
                graph = tracer.trace(model, concrete_args=_defaulted(model, example))
            break
        except Exception as exc:
            module = _failed_in(exc, model)
            if module is None or len(leaves) >= MAX_LEAVES or isinstance(exc, TorchlowerError):
                raise _failed(model, exc) from exc
            path, kind = tracer.path_of_module(module), type(module).__name__
            leaves[id(module)] = (
                f"{path} ({kind}) whole through torch.export: FX cannot trace it ({_first(exc)})"
            )
    gm = fx.GraphModule(tracer.root, graph, type(model).__name__)
    gm.meta[LEAVES] = list(leaves.values())
    return gm


LEAVES = "torchlower_untraceable"  # GraphModule.meta key: submodules kept whole, with FX's reason
MAX_LEAVES = 16  # submodules kept whole before the trace is given up


def _failed_in(exc: BaseException, root: nn.Module) -> nn.Module | None:
    """The innermost submodule whose ``forward`` was running when tracing failed (read off the
    traceback, so the tracer adds no frame of its own to the stacks nodes record)."""
    found, tb = None, exc.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self") if tb.tb_frame.f_code.co_name == "forward" else None
        if isinstance(owner, nn.Module) and owner is not root and not isinstance(owner, fx.GraphModule):
            found = owner
        tb = tb.tb_next
    return found


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:300]


def _failed(model: nn.Module, exc: BaseException) -> TraceError:
    line = raised_at(exc)
    return TraceError(
        f"FX tracing failed on {type(model).__qualname__}{f' at {line}' if line else ''}: {_first(exc)}"
    )


_SIZE_VARARGS = ("zeros", "ones", "empty", "rand", "randn")
_FROM_DATA = ("tensor", "as_tensor", "scalar_tensor")


@contextlib.contextmanager
def _packed_sizes() -> Iterator[None]:
    """``torch.zeros(n, d)`` with traced sizes recorded as ``torch.zeros((n, d))``.

    torch's argument parser packs ``*size`` only when the first size is an int, so with FX
    proxies (``x.size(1)``) the call fails ("zeros() takes 1 positional argument"); a tuple of
    proxies is accepted and traced. ``torch.tensor(proxy)`` does not dispatch to FX at all: it
    is recorded as a call here.
    """
    originals = {name: getattr(torch, name) for name in (*_SIZE_VARARGS, *_FROM_DATA)}

    def packing(fn: Any) -> Any:
        @functools.wraps(fn)
        def call(*size: Any, **kwargs: Any) -> Any:
            if len(size) > 1 and any(isinstance(s, fx.Proxy) for s in size):
                return fn(tuple(size), **kwargs)
            return fn(*size, **kwargs)

        return call

    def recording(fn: Any) -> Any:
        @functools.wraps(fn)
        def call(data: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(data, fx.Proxy):  # torch.tensor(x.numel()): recorded, folded when static
                return data.tracer.create_proxy("call_function", fn, (data, *args), kwargs)
            return fn(data, *args, **kwargs)

        return call

    try:
        for name, fn in originals.items():
            setattr(torch, name, packing(fn) if name in _SIZE_VARARGS else recording(fn))
        yield
    finally:
        for name, fn in originals.items():
            setattr(torch, name, fn)


_STATIC_ATTRS = ("dtype", "ndim", "dim", "is_complex", "is_floating_point")


class _Proxy(fx.Proxy):
    """Records ``x[index] = value`` as an ``operator.setitem`` call (FX proxies refuse it)."""

    def __len__(self) -> int:
        """``tuple(x.split(2))``: the length of the real run's value, when inputs are known."""
        tracer = self.tracer
        if isinstance(tracer, Tracer) and tracer.example is not None:
            value = tracer._evaluate(self.node)
            if isinstance(value, (tuple, list, torch.Tensor)):
                return len(value)
        return super().__len__()

    def __getattr__(self, name: str) -> Any:
        """``x.dtype`` is the real run's dtype when inputs are known (``torch.finfo(x.dtype)``);
        so are the rank (``x.dim()``, ``x.ndim``: torchaudio's ``if x_db.dim() > 2``) and
        ``x.is_complex()``, which no dynamic size changes."""
        tracer = self.tracer
        if name in _STATIC_ATTRS and isinstance(tracer, Tracer) and tracer.example is not None:
            value = tracer._evaluate(self.node)
            if isinstance(value, torch.Tensor):
                return getattr(value, name)
        if name == "shape" and isinstance(tracer, Tracer) and tracer.example is not None:
            return _Shape(self, name)  # ``len(x.shape)`` is the rank (speechbrain's features)
        return super().__getattr__(name)

    def __setitem__(self, index: Any, value: Any) -> None:
        self.tracer.create_proxy("call_function", operator.setitem, (self, index, value), {})


class _Shape(fx.proxy.Attribute):
    """``x.shape`` of a traced tensor: its sizes stay traced, its length is the real run's rank."""

    def __len__(self) -> int:
        value = self.tracer._evaluate(self.root.node)  # type: ignore[attr-defined]
        if isinstance(value, torch.Tensor):
            return value.dim()
        return super().__len__()


class ShapePass(ShapeProp):
    """One real forward pass: shapes for every node, real inputs where ``torch.export`` may lower.

    That is leaf modules without a rule and torch Python functions without an ATen rule.
    """

    def __init__(self, module: fx.GraphModule, rules: Registry) -> None:
        super().__init__(module)
        self.rules = rules

    def run_node(self, n: fx.Node) -> Any:
        if n.op in ("call_module", "call_function"):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
        if n.op == "call_module":
            export = self.rules.lookup_module(type(self.fetch_attr(n.target))) is None
        else:
            export = n.op == "call_function" and lowered_by_export(n.target, args, kwargs, self.rules)
        if export:
            n.meta[EXAMPLE] = pytree.tree_map_only(torch.Tensor, torch.clone, (args, kwargs))
        return super().run_node(n)


def lowered_by_export(target: Any, args: Any, kwargs: dict[str, Any], rules: Registry) -> bool:
    """A torch Python function call (``F.interpolate``, ``torch.norm(p="fro")``) that reaches no
    rule, or a function a library wrapped for FX (``torch.fx.wrap``).

    FX records such calls whole; the interpreter lowers them through ``torch.export`` of the call
    alone, which yields the ATen ops the Python code dispatches to. Decided on the real call,
    with the tensors standing in as values, exactly as the interpreter will resolve it.
    """
    if not isinstance(target, types.FunctionType) or target in pycalls.OPERATORS:
        return False
    if rules.lookup_function(target):
        return False
    if not getattr(target, "__module__", "").startswith("torch."):
        return True  # a library's ``torch.fx.wrap``-ed function (torchvision's stochastic_depth…)
    probe = lambda t: Value("probe", t.dtype, tuple(t.shape))  # noqa: E731
    args, kwargs = pytree.tree_map_only(torch.Tensor, probe, (tuple(args), dict(kwargs)))
    try:
        call = pycalls.resolve_function(target, args, kwargs)
    except TorchlowerError:
        return True
    return call.bound is None or rules.lookup_function(call.bound.key) is None

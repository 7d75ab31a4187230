"""The FX front end's interpreter: an FX graph run with symbolic values.

``Interpreter`` is generic over ``builder.rules``: it runs an FX graph (from ``Tracer`` or from
``torch.export``) where every tensor is a ``Value``, sending each call through the shared
session to a rule. Shapes and dtypes come from one real forward pass (``ShapeProp``) or from
``torch.export``'s ``meta["val"]``, never from guessing.
"""

from __future__ import annotations

import inspect
import math
import operator
import re
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import fx, nn
from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
from torch.nn import functional as F
from torch.utils import _pytree as pytree

from torchlower.core import dynamic_sizes
from torchlower.core.values import MISSING, Missing, SymDim, Value, constant
from torchlower.errors import LoweringError
from torchlower.frontends import fx_dynamic, fx_interpolate, fx_views, provenance, pycalls
from torchlower.frontends.fx_index import fold as _fold
from torchlower.frontends.fx_index import lower_getitem, lower_setitem, static
from torchlower.frontends.fx_trace import EXAMPLE
from torchlower.frontends.session import Meta, Session, stamp
from torchlower.rules.common import size_tensor
from torchlower.rules.registry import describe

_SHAPE_METHODS = {"size", "dim", "ndimension", "numel", "nelement"}


_SET_GRAD = torch.ops.higher_order.wrap_with_set_grad_enabled


class Escape(Protocol):
    """Lowers what FX could not trace but ran on an example (a leaf ``torch.nn`` module, a
    call FX recorded whole) another way: the export front end provides it
    (``frontends/export.ESCAPE``), so the interpreter it also uses does not import it."""

    def lower_submodule(
        self,
        builder: Any,
        session: Session,
        module: nn.Module,
        args: Any,
        kwargs: Any,
        example: Any,
        where: str,
    ) -> Any: ...

    def lower_call(
        self, builder: Any, session: Session, target: Any, args: Any, kwargs: Any, example: Any, where: str
    ) -> Any: ...


class Interpreter(fx.Interpreter):
    """Runs an FX graph with symbolic values, lowering every call into ``builder``."""

    def __init__(
        self,
        module: nn.Module,
        builder: Any,
        session: Session | None = None,
        *,
        prefix: str = "",
        escape: Escape,
    ) -> None:
        super().__init__(module, garbage_collect_values=False)  # writes through views read old values
        self.builder = builder
        self.escape = escape
        self.owns_session = session is None
        self.session = session if session is not None else Session(builder, "fx")
        self.prefix = prefix  # module path of a nested graph: labels and names stay global
        self.extra_traceback = False
        self._node: fx.Node | None = None
        self._inplace = False
        self.inplace_nodes: set[fx.Node] = set()
        self.symbols: dict[str, str] = {}  # torch.export's symbol names → the user's (dynamic axes)
        self.reads_error: Exception | None = None  # raised where ``aten.item`` reads no known size
        # nested (a leaf module or call lowered through its own program): the calling line
        self.outer_location = session.location if session is not None else None

    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Interpret; when this interpreter owns the session, raise every missing op at once."""
        result = super().run(*args, **kwargs)
        if self.owns_session:
            self.session.finish()
        return result

    def run_node(self, n: fx.Node) -> Any:
        self._node, self._inplace = n, False
        self.session.scope = module_path(n, self.prefix)
        self.session.location = source_location(n, self.session.scope, self.outer_location)
        result = super().run_node(n)
        if self._inplace and n.args and isinstance(n.args[0], fx.Node):
            self.inplace_nodes.add(n)  # later readers of the operand (and of its base) see the result
            fx_views.write_through(self, n, n.args[0], result)
        writes, self.session.writes[:] = list(self.session.writes), []
        for old, new in writes:  # a wrapped function wrote into its argument (MViT's _add_shortcut)
            for target in n.all_input_nodes:
                if self.env.get(target) is old:
                    fx_views.write_through(self, n, target, new)
        return result

    # ---- opcodes ------------------------------------------------------------------------
    def get_attr(self, target: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        item = self.fetch_attr(target)
        return constant(item.detach(), label=self.prefix + target) if isinstance(item, torch.Tensor) else item

    def call_module(self, target: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        module = self.fetch_attr(target)
        where = self.prefix + target
        if self.builder.rules.lookup_module(type(module)) is not None:
            inputs = _bind_signature(module.forward, args, kwargs)
            return self.session.apply_module(module, inputs, where, self._metas())
        example = self._node.meta.get(EXAMPLE) if self._node is not None else None
        if example is None or _has_missing((args, kwargs)):
            if example is None:
                self.session.record_missing(describe(type(module)), where)
            return MISSING
        return self.escape.lower_submodule(
            self.builder, self.session, module, args, kwargs, example, where + "."
        )

    def call_function(self, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if target is _SET_GRAD:  # ``with torch.no_grad():`` in forward: grad mode means nothing here
            return self._inline(args[1], args[2:])
        if target is operator.getitem and isinstance(args[0], Value):
            return lower_getitem(self.session, args[0], args[1], self._where(), self._metas())
        if target is operator.setitem and isinstance(args[0], Value):
            self._inplace = True  # later readers of x see the result
            return lower_setitem(self.session, args[0], args[1], args[2], self._where())
        if target is getattr and isinstance(args[0], (tuple, list)) and self._node is not None:
            return args[0][_return_field(self._node.args[0], args[1])]  # topk(...).values
        if target in (operator.getitem, getattr, len) and not isinstance(args[0], Value):
            return MISSING if isinstance(args[0], Missing) else target(*args, **kwargs)
        if target in pycalls.OPERATORS and not _has_tensors((args, kwargs)):
            try:  # Python arithmetic on sizes and scalars (``x.size(-1) // heads``, ``S * 2``)
                return target(*args, **kwargs)
            except TypeError:
                pass  # e.g. ``S / 2``: the rules materialize it
        if target in (torch.sym_max, torch.sym_min) and not _has_tensors((args, kwargs)):
            sized = dynamic_sizes.scalar_op(target.__name__, args)  # ``max(0, table - S)`` on sizes
            return target(*args) if sized is NotImplemented else sized
        if target is getattr and args[1] in ("real", "imag"):  # complex parts: ops, not attributes
            return self.session.apply(f"aten::{args[1]}", [args[0]], self._where(), self._metas())
        if target is getattr:
            return _value_attr(args[0], args[1])
        if target is len:
            return _dims(args[0])[0]
        if isinstance(target, torch._ops.OpOverload):
            if not target._schema.returns:  # _assert_* checks of export: nothing to lower
                return None
            if target._schema.name in ("aten::sym_size", "aten::sym_numel") and isinstance(args[0], Value):
                shape = _dims(args[0])
                return shape[args[1]] if len(args) > 1 else math.prod(shape)
            if target._schema.name in ("aten::item", "aten::_local_scalar_dense") and self.reads_error:
                return self.read_size(args[0])
        rule = self.builder.rules.lookup_function(target)
        if rule is not None and rule.key is target:  # a user rule keyed by the Python callable
            inputs = _bind_signature(target, args, kwargs)
            fold = _fold(target, args, kwargs)
            return self.session.apply(target, inputs, self._where(), self._metas(), fold)
        resized = fx_interpolate.symbolic_call(args, kwargs) if target is F.interpolate else None
        if resized is not None:  # to a symbolic size, which torch.export would bake
            return self.session.apply(resized[0], resized[1], self._where(), self._metas())
        example = self._node.meta.get(EXAMPLE) if self._node is not None else None
        if example is not None and not _has_missing((args, kwargs)):  # see ``lowered_by_export``
            return self.escape.lower_call(
                self.builder, self.session, target, args, kwargs, example, self._where()
            )
        call = pycalls.resolve_function(target, args, kwargs)
        if call.bound is None and any(isinstance(a, SymDim) for a in args):
            # torch.export writes `arange(S) + P` as add.Tensor(tensor, SymInt): a size in a
            # tensor slot becomes a rank-0 i64 tensor holding it
            args = tuple(size_tensor(self.builder, a) if isinstance(a, SymDim) else a for a in args)
            call = pycalls.resolve_function(target, args, kwargs)
        return self._apply(call, target, args, kwargs)

    def call_method(self, target: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self_arg = args[0]
        if isinstance(self_arg, SymDim) and hasattr(torch.Tensor, target):
            # a tensor that holds a size (``(arange(P, P + S)[0] + 1).float()``) is one again
            self_arg = size_tensor(self.builder, self_arg)
            args = (self_arg, *args[1:])
        if not isinstance(self_arg, (Value, Missing)):
            return getattr(self_arg, target)(*args[1:], **kwargs)
        if target in _SHAPE_METHODS:
            if isinstance(self_arg, Missing):
                return MISSING
            shape = _dims(self_arg)
            if target == "size":
                dim = args[1] if len(args) > 1 else kwargs.get("dim")
                return _size(shape) if dim is None else shape[dim]
            return len(shape) if target in ("dim", "ndimension") else math.prod(shape)
        method = getattr(torch.Tensor, target, None)
        fold = _fold(method, args, kwargs) if method is not None else None
        call = pycalls.resolve_method(target, args, kwargs)
        return self._apply(call, f"Tensor.{target}", args, kwargs, fold)

    def read_size(self, x: Any) -> Any:
        """``aten.item`` of a tensor that holds a size (``arange(P, P + S)[0] + S``): the size
        expression, so what torch.export sized with it (its unbacked ``u0``) is sized by it too.
        Any other value read from a tensor is data the artifact cannot know: ``reads_error``."""
        size = x if isinstance(x, (int, SymDim)) else x.size_value if isinstance(x, Value) else None
        if size is None:
            raise self.reads_error  # type: ignore[misc]
        return size

    # ---- helpers ------------------------------------------------------------------------
    def _inline(self, graph: fx.GraphModule, inputs: tuple[Any, ...]) -> Any:
        """A nested graph of torch.export (a higher-order op's body) lowered in place."""
        inner = Interpreter(graph, self.builder, self.session, prefix=self.prefix, escape=self.escape)
        inner.symbols = self.symbols
        return inner.run(*inputs)

    def _apply(
        self, call: pycalls.Call, target: Any, args: Any, kwargs: dict[str, Any], fold: Any = "original"
    ) -> Any:
        fold = _fold(target, args, kwargs) if fold == "original" else fold
        self._inplace = call.inplace
        if call.bound is not None and call.first_only:
            out = self.session.apply(call.bound.key, call.bound.args, self._where(), None, call.bound.fold)
            return out if isinstance(out, Missing) else stamp(out[0], self._metas())
        if call.bound is not None:
            return self.session.apply(call.bound.key, call.bound.args, self._where(), self._metas(), fold)
        if self.builder.rules.lookup_function(call.op) is not None and not _has_missing((args, kwargs)):
            raise LoweringError(
                f"{self._where()}: no overload of {call.op} accepts the arguments "
                f"{_describe_args(args, kwargs)}"
            )
        return self.session.apply(call.op, [*args, *kwargs.values()], self._where(), self._metas(), fold)

    def _where(self) -> str:
        return self.prefix + (self._node.name if self._node is not None else "")

    def _metas(self) -> list[Meta] | None:
        return node_metas(self._node, self.symbols) if self._node is not None else None


def _dim(d: Any, symbols: dict[str, str]) -> Any:
    """An int, or a torch SymInt as a SymDim over the user's symbol names."""
    if isinstance(d, int):
        return int(d)
    if isinstance(d, torch.SymInt) and symbols:
        import sympy

        expr = d.node.expr
        subs = {s: sympy.Symbol(symbols[str(s)], integer=True, positive=True) for s in expr.free_symbols}
        if all(str(s) in symbols for s in expr.free_symbols):
            return SymDim.wrap(expr.subs(subs))
        raise LoweringError(f"size {expr} uses symbols torch.export made up ({sorted(map(str, subs))})")
    return str(d)


def node_metas(node: fx.Node, symbols: dict[str, str] | None = None) -> list[Meta] | None:
    """dtype/shape of a node's tensor results, from export's ``val`` or FX's ``tensor_meta``."""
    found = node.meta.get("val", node.meta.get("tensor_meta"))
    if found is None:
        return None
    leaves = fx_dynamic.meta_leaves(found)
    fitted = fx_dynamic.symbolic_shapes(node) or [None] * len(leaves)
    metas: list[Meta] = []
    for leaf, shape in zip(leaves, fitted, strict=True):
        if shape is not None:  # sizes that move with the dynamic axes
            metas.append((leaf.dtype, shape))
            continue
        if isinstance(leaf, (torch.Tensor,)) or (hasattr(leaf, "dtype") and hasattr(leaf, "shape")):
            if free_unbacked_symbols(tuple(leaf.shape)):  # data-dependent (index with a mask): the
                metas.append((leaf.dtype, None))  # rule's own shape stands (static when the mask is)
                continue
            metas.append((leaf.dtype, tuple(_dim(d, symbols or {}) for d in leaf.shape)))
        else:
            metas.append((None, None))
    return metas


def module_path(node: fx.Node, prefix: str) -> str:
    """The module a node belongs to: the module itself for ``call_module``, else the innermost
    entry of ``nn_module_stack`` (FX and torch.export record it), under ``prefix``."""
    if node.op == "call_module":
        return prefix + str(node.target)
    stack = node.meta.get("nn_module_stack") or {}
    inner = ""
    if stack:
        entry = list(stack.values())[-1]
        inner = entry[0] if isinstance(entry, tuple) else str(entry)
        inner = inner.removeprefix("L['self'].").removeprefix("L['self']")
    return (prefix + inner).rstrip(".") if inner or prefix else ""


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def source_location(node: fx.Node, scope: str, outer: str | None = None) -> str | None:
    """``block.1 (model.py:12 in forward)``: the module path and the model's source line, from
    the ``stack_trace`` torch.export / FX keep in node meta: its innermost frame of the user's code
    (symbolic tracing records torch.fx's own frames below it). A node with no frame of the
    user's (an op inside a torch module lowered through its own program) takes ``outer``, the
    line that called that module; never a file of torch, torchlower or the caller's harness."""
    frames = _FRAME.findall(str(node.meta.get("stack_trace") or ""))
    found = provenance.model_frame(frames[::-1])
    line = f"{Path(found[0]).name}:{found[1]} in {found[2]}" if found else ""
    if not line and outer and ".py:" in outer:
        return outer
    if not (scope or line):
        return None
    if not line:
        return scope
    return f"{scope} ({line})" if scope else line


# ---- small helpers -------------------------------------------------------------------------
def _has_tensors(tree: Any) -> bool:
    return any(isinstance(leaf, (Value, Missing)) for leaf in pytree.tree_leaves(tree))


def _dims(x: Value) -> tuple[Any, ...]:
    """Sizes of ``x``: ints, or ``SymDim`` on dynamic axes."""
    return tuple(x.shape) if x.shape is not None else static(x)


def _size(shape: tuple[Any, ...]) -> Any:
    """``x.size()``: a ``torch.Size`` when static (models call its methods), else a tuple."""
    return torch.Size(shape) if all(isinstance(d, int) for d in shape) else shape


def _bind_signature(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    """Positional arguments in the signature's order, defaults filled (for user rules)."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        raise LoweringError(f"cannot bind arguments of {describe(fn)}: {exc}") from exc
    bound.apply_defaults()
    out: list[Any] = []
    for name, param in bound.signature.parameters.items():
        value = bound.arguments.get(name)
        if param.kind is param.VAR_POSITIONAL:
            out.extend(value or ())
        elif param.kind is param.VAR_KEYWORD:
            if value:
                raise LoweringError(f"{describe(fn)}: keyword arguments {sorted(value)} cannot be lowered")
        else:
            out.append(value)
    return out


def _value_attr(x: Value, name: str) -> Any:
    if name == "shape":
        return _size(_dims(x))
    if name == "ndim":
        return x.rank
    if name == "dtype":
        return x.dtype
    if name == "device":
        return torch.device("cpu")
    if name in ("is_cuda", "is_quantized"):
        return False
    raise LoweringError(f"attribute {name!r} of a traced tensor cannot be lowered")


def _has_missing(item: Any) -> bool:
    return any(isinstance(leaf, Missing) for leaf in pytree.tree_leaves(item))


def _describe_args(args: Any, kwargs: dict[str, Any]) -> str:
    def one(a: Any) -> str:
        if isinstance(a, Value):
            return f"Tensor{list(a.shape or ())}"
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(one(x) for x in a) + "]"
        return repr(a)

    parts = [one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()]
    return "(" + ", ".join(parts) + ")"


def _return_field(producer: Any, name: str) -> int:
    """Position of ``name`` in the named tuple of ``torch.return_types`` that ``producer`` returns."""
    target = producer.target if isinstance(producer, fx.Node) else None
    op = target if isinstance(target, str) else getattr(target, "__name__", "")
    kind = getattr(torch.return_types, op.strip("_"), None)
    try:
        return getattr(kind(range(kind.n_fields)), name)  # type: ignore[union-attr]
    except (AttributeError, TypeError):
        raise LoweringError(
            f"attribute {name!r} of the result of {op or producer} cannot be lowered"
        ) from None

"""Bind Python-level calls to ATen schemas, so every front end hands rules the same arguments.

Rules take their arguments positionally in ATen schema order with defaults filled. The jit
front end gets that order from TorchScript; FX and ``torch.export`` graphs carry Python-style
``args``/``kwargs`` (``x.view(2, 3)``, ``torch.softmax(x, dim=1)``, ``aten.add.Tensor``), which
are bound here against the op's schema(s), choosing the first overload whose types accept them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from torchlower.core.values import Missing, SymDim, Value

_NO = object()  # "does not fit this schema type"


@dataclass(frozen=True)
class Bound:
    """A call bound to one ATen overload: the rule key and the arguments in schema order."""

    key: str  # "aten::softmax.int"
    args: list[Any]
    schema: torch._C.FunctionSchema

    @property
    def fold(self) -> Callable[..., Any]:
        """The overload as a torch callable taking the schema-ordered arguments."""
        return overload_callable(self.schema)


def key_of(schema: torch._C.FunctionSchema) -> str:
    return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name


@functools.cache
def schemas_for(name: str) -> tuple[torch._C.FunctionSchema, ...]:
    """Every non-``out`` overload of ``name`` (``"aten::softmax"``), in TorchScript's order."""
    try:
        found = torch._C._jit_get_schemas_for_operator(name)
    except RuntimeError:
        return ()
    return tuple(s for s in found if not any(a.is_out for a in s.arguments))


def bind_op(name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Bound | None:
    """Bind to the first overload of ``name`` whose argument types accept ``args``/``kwargs``."""
    for schema in schemas_for(name):
        bound = bind_schema(schema, args, kwargs)
        if bound is not None:
            return Bound(key_of(schema), bound, schema)
    for schema in schemas_for(name):  # last resort: a 0-d graph tensor where a number goes
        bound = bind_schema(schema, args, kwargs, tensor_numbers=True)  # torch.arange(s, e) on inputs
        if bound is not None:
            return Bound(key_of(schema), bound, schema)
    return None


def bind_schema(
    schema: torch._C.FunctionSchema,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    wrapped_numbers: bool = False,
    tensor_numbers: bool = False,
) -> list[Any] | None:
    """Arguments in schema order (defaults filled, ints widened to int lists), or None.

    ``wrapped_numbers`` accepts a Python number for a ``Tensor`` parameter: ``torch.export``
    graphs call the exact overload ``aten.add.Tensor(x, 1)`` with such "wrapped numbers", and
    rules accept Python scalars as tensor operands. Overload *choice* never relies on it.
    ``tensor_numbers`` accepts a 0-d tensor computed in the graph for an ``int`` / ``Scalar``
    parameter (Python reads it as its number); tried only after no overload fits without it.
    """
    params = list(schema.arguments)
    positional = [p for p in params if not p.kwarg_only]
    args = list(args)
    if len(args) > len(positional):  # x.view(2, 3) / x.permute(0, 2, 1): pack trailing varargs
        last = positional[-1] if positional else None
        if last is None or not isinstance(last.real_type, torch._C.ListType):
            return None
        args = [*args[: len(positional) - 1], args[len(positional) - 1 :]]
    given = dict(zip((p.name for p in positional), args, strict=False))
    names = {p.name for p in params}
    for name, value in kwargs.items():
        name = "self" if name == "input" and "input" not in names else name
        if name not in names and value is None:
            continue  # Python's "None means absent" (torch.norm(..., dtype=None) → norm.ScalarOpt_dim)
        if name not in names or name in given:
            return None
        given[name] = value
    out: list[Any] = []
    for p in params:
        if p.name not in given:
            if not p.has_default_value():  # `int[1]? dim` without default is required
                return None
            out.append(p.default_value)
            continue
        value = given[p.name]
        if value is None and p.has_default_value() and not _optional(p.real_type):
            out.append(p.default_value)  # Python's "None means default" (max_pool's stride)
            continue
        if tensor_numbers and _graph_number(p.real_type, value):
            out.append(value)
            continue
        value = coerce(p.real_type, p.N, value, wrapped_numbers)
        if value is _NO:
            return None
        out.append(value)
    return out


def overload_callable(schema: torch._C.FunctionSchema) -> Callable[..., Any]:
    """``torch.ops`` overload called with schema-ordered args (keyword-only ones by name)."""
    namespace, name = schema.name.split("::", 1)
    packet = getattr(getattr(torch.ops, namespace), name)
    op = getattr(packet, schema.overload_name or "default")
    kw_names = [p.name for p in schema.arguments if p.kwarg_only]
    n_pos = len(schema.arguments) - len(kw_names)

    def call(*args: Any) -> Any:
        return op(*args[:n_pos], **dict(zip(kw_names, args[n_pos:], strict=True)))

    return call


def coerce(ty: Any, n: int | None, value: Any, wrapped_numbers: bool = False) -> Any:
    """``value`` as the schema type ``ty`` wants it, or ``_NO`` when it does not fit."""
    if isinstance(ty, torch._C.OptionalType):
        return None if value is None else coerce(ty.getElementType(), n, value, wrapped_numbers)
    if isinstance(ty, torch._C.TensorType):
        if wrapped_numbers and isinstance(value, (int, float, bool, complex)):
            return value
        return value if isinstance(value, (Value, Missing)) else _NO  # Missing: still name the op
    if isinstance(ty, torch._C.ListType):
        elem = ty.getElementType()
        if isinstance(value, (int, float)) and not isinstance(value, bool) and n is not None:
            value = [value] * n  # int[2] kernel_size=3 means [3, 3]
        elif isinstance(value, int) and not isinstance(value, bool) and str(elem) in ("int", "SymInt"):
            value = [value]
        if not isinstance(value, (list, tuple)):
            return _NO
        items = [coerce(elem, None, v) for v in value]
        return _NO if any(i is _NO for i in items) else items
    kind = str(ty)
    if isinstance(value, Value) and value.is_const and value.const.dim() == 0 and kind in _NUMBERS:
        value = value.const.item()  # torch.arange(torch.tensor(5)): Python reads a 0-d tensor as its number
        if kind in ("int", "SymInt") and not isinstance(value, int):
            return _NO
    if kind in ("int", "SymInt"):
        sized = isinstance(value, int) and not isinstance(value, bool)
        return value if sized or isinstance(value, SymDim) else _NO
    if kind == "float":
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else _NO
    if kind == "bool":
        return value if isinstance(value, bool) else _NO
    if kind in ("Scalar", "number"):
        return value if isinstance(value, (int, float, bool, complex, SymDim)) else _NO
    if kind == "str":
        return value if isinstance(value, str) else _NO
    if kind == "ScalarType":
        return value if isinstance(value, torch.dtype) else _NO
    if kind == "MemoryFormat":
        return value if isinstance(value, torch.memory_format) else _NO
    if kind == "Layout":
        return value if isinstance(value, torch.layout) else _NO
    if kind == "Device":
        return value if isinstance(value, (torch.device, str)) else _NO
    return _NO


_NUMBERS = ("int", "SymInt", "float", "Scalar", "number")


def _graph_number(ty: Any, value: Any) -> bool:
    """A rank-0 tensor computed in the graph passed where the schema wants a number."""
    if isinstance(ty, torch._C.OptionalType):
        ty = ty.getElementType()
    return isinstance(value, Value) and not value.is_const and value.rank == 0 and str(ty) in _NUMBERS


def _optional(ty: Any) -> bool:
    return isinstance(ty, torch._C.OptionalType)

"""Map Python-level calls recorded by FX onto ATen ops, with arguments in schema order.

FX records what the user wrote: ``torch.relu``, ``F.relu(x, inplace=True)``, ``operator.add``,
``x.view(2, 3)``, ``torch.ops.aten.add.Tensor``. Builtin torch functions name their ATen op
(TorchScript's builtin table); ``F.*`` / ``torch.functional`` Python wrappers are bound by their
Python signature and then by name against the ATen op of the same name; a small table covers
only where Python and ATen differ. Python-only arguments are honoured or rejected, never dropped.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.jit._builtins import _find_builtin

from torchlower.core.values import Value, constant
from torchlower.errors import LoweringError
from torchlower.frontends.schemas import Bound, bind_op, bind_schema, key_of, schemas_for
from torchlower.rules.registry import describe

# operator → (ATen op, in place); reflected forms (2 - x) are handled in ``_operator``
OPERATORS: dict[Callable[..., Any], tuple[str, bool]] = {
    operator.add: ("add", False), operator.sub: ("sub", False), operator.mul: ("mul", False),
    operator.truediv: ("div", False), operator.floordiv: ("floor_divide", False),
    operator.mod: ("remainder", False), operator.pow: ("pow", False), operator.matmul: ("matmul", False),
    operator.neg: ("neg", False), operator.abs: ("abs", False), operator.invert: ("bitwise_not", False),
    operator.and_: ("bitwise_and", False), operator.or_: ("bitwise_or", False),
    operator.xor: ("bitwise_xor", False), operator.eq: ("eq", False), operator.ne: ("ne", False),
    operator.lt: ("lt", False), operator.le: ("le", False), operator.gt: ("gt", False),
    operator.ge: ("ge", False), operator.iadd: ("add", True), operator.isub: ("sub", True),
    operator.imul: ("mul", True), operator.itruediv: ("div", True), operator.imatmul: ("matmul", True),
    operator.iand: ("bitwise_and", True), operator.ior: ("bitwise_or", True),
}  # fmt: skip
_COMMUTATIVE = {"add", "mul", "eq", "ne", "bitwise_and", "bitwise_or", "bitwise_xor"}
_MIRRORED = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}

# Python wrapper → ATen: renamed parameters and fills for ATen-only parameters
_RENAMES: dict[str, dict[str, str]] = {
    "dropout": {"training": "train"}, "alpha_dropout": {"training": "train"},
    "feature_alpha_dropout": {"training": "train"}, "embedding": {"input": "indices"},
    "split": {"tensor": "self", "split_size_or_sections": "split_size"},
}  # fmt: skip
_FILLS: dict[str, dict[str, Any]] = {
    "batch_norm": {"cudnn_enabled": True}, "instance_norm": {"cudnn_enabled": True},
}  # fmt: skip
_IGNORED = {"_stacklevel"}  # Python bookkeeping with no effect on the result
_DTYPE_METHODS = {
    "float": torch.float32, "double": torch.float64, "half": torch.float16, "bfloat16": torch.bfloat16,
    "int": torch.int32, "long": torch.int64, "short": torch.int16, "bool": torch.bool,
}  # fmt: skip
_AS_METHODS = {"view_as": "view", "reshape_as": "reshape", "expand_as": "expand"}


@dataclass(frozen=True)
class Call:
    """A Python-level call resolved to an ATen op: ``bound`` is None when no overload fits."""

    op: object  # "aten::relu", or the Python target itself when it has no ATen op
    bound: Bound | None
    inplace: bool = False
    first_only: bool = False  # Python returns only the first ATen result (return_indices=False)


def resolve_function(target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    """Resolve an FX ``call_function`` target."""
    if isinstance(target, torch._ops.OpOverload):
        bound = bind_schema(target._schema, args, kwargs, wrapped_numbers=True)
        name = key_of(target._schema)
        return Call(name, Bound(name, bound, target._schema) if bound is not None else None)
    if isinstance(target, torch._ops.OpOverloadPacket):
        return _bind(target._qualified_op_name, args, kwargs)
    if target in OPERATORS:
        return _operator(target, args)
    builtin = _find_builtin(target)
    if builtin is not None and builtin.startswith("aten::"):
        call = _bind(builtin, args, kwargs)
        if call.bound is None and len(args) > 1 and _is_number(args[0]) and isinstance(args[1], Value):
            # torch.mul(2.0, x) / torch.sub(1, x): the number is a 0-d tensor in Python's promotion
            number = constant(torch.tensor(args[0], dtype=_scalar_dtype(args[0], args[1])))
            call = _bind(builtin, (number, *args[1:]), kwargs)
        return call
    if getattr(target, "__module__", "") in ("torch.nn.functional", "torch.functional", "torch"):
        return _wrapper(target, args, kwargs)
    return Call(target, None)


def resolve_method(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    """Resolve an FX ``call_method`` on a tensor: ``x.view(2, 3)`` → ``aten::view``."""
    self = args[0]
    if name in _DTYPE_METHODS and not args[1:] and not kwargs:
        return _bind("aten::to", (self, _DTYPE_METHODS[name]), {})
    if name == "type_as" and isinstance(args[1], Value):
        return _bind("aten::to", (self, args[1].dtype), {})
    if name in _AS_METHODS and isinstance(args[1], Value):
        return _bind(f"aten::{_AS_METHODS[name]}", (self, list(args[1].static_shape())), {})
    inplace = name.endswith("_") and not name.endswith("__")
    return _bind(f"aten::{name[:-1] if inplace else name}", args, kwargs, inplace)


def resolvable(target: Any) -> bool:
    """Whether a ``call_function`` target maps onto an ATen op at all (used to pick FX leaves)."""
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)) or target in OPERATORS:
        return True
    if target in (operator.getitem, getattr, len):
        return True
    builtin = _find_builtin(target)
    if builtin is not None:
        return builtin.startswith("aten::")
    name = getattr(target, "__name__", "").lstrip("_")
    return bool(schemas_for(f"aten::{name}"))


def _bind(op: str, args: Any, kwargs: dict[str, Any], inplace: bool = False) -> Call:
    return Call(op, bind_op(op, tuple(args), kwargs), inplace)


def _operator(target: Any, args: tuple[Any, ...]) -> Call:
    name, inplace = OPERATORS[target]
    if len(args) == 2 and _is_number(args[0]) and isinstance(args[1], Value):
        scalar, x = args
        if name in _COMMUTATIVE:
            args = (x, scalar)
        elif name in _MIRRORED:
            name, args = _MIRRORED[name], (x, scalar)
        elif name == "sub":
            name, args = "rsub", (x, scalar)
        elif name != "pow":  # pow has a Scalar-base overload; the others want a tensor
            args = (constant(torch.tensor(scalar, dtype=_scalar_dtype(scalar, x))), x)
    return _bind(f"aten::{name}", args, {}, inplace)


def _wrapper(target: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    """``F.relu(x, inplace=True)``, ``F.batch_norm(...)``, ``torch.functional.einsum``…"""
    name = target.__name__.lstrip("_")
    if name == "einsum":  # einsum(equation, *operands)
        operands = args[1] if len(args) == 2 and isinstance(args[1], (list, tuple)) else args[1:]
        return _bind("aten::einsum", (args[0], list(operands)), kwargs)
    params = _signature(target)
    if params is None:
        return Call(target, None)
    try:
        bound = params.bind(*args, **kwargs)
    except TypeError as exc:
        raise LoweringError(f"{describe(target)}: {exc}") from exc
    bound.apply_defaults()  # Python's defaults are the semantics the user asked for
    defaults = {p.name: p.default for p in params.parameters.values()}
    given = {**_FILLS.get(name, {}), **bound.arguments}
    inplace = bool(given.pop("inplace", False))
    indices = given.pop("return_indices", None)
    if indices:
        name += "_with_indices"
    renames = _RENAMES.get(name, {})
    given = {renames.get(k, k): v for k, v in given.items() if k not in _IGNORED}
    op = f"aten::{name}"
    schemas = schemas_for(op)
    if not schemas:
        return Call(target, None)
    known = {a.name for s in schemas for a in s.arguments} | {"input", "tensor"}
    for key in [k for k in given if k not in known]:
        value = given.pop(key)
        original = next((k for k, v in renames.items() if v == key), key)
        if value is not defaults.get(original) and value != defaults.get(original):
            raise LoweringError(
                f"{describe(target)}: argument {original}={value!r} has no counterpart in {op}; "
                f"only the default {defaults.get(original)!r} can be lowered"
            )
    if "tensor" in given and "self" not in given:
        given["self"] = given.pop("tensor")
    call = _bind(op, (), given, inplace)
    if indices is False and call.bound is not None and len(call.bound.schema.returns) > 1:
        return Call(call.op, call.bound, inplace, first_only=True)  # adaptive_max_pool2d → (values, idx)
    return call


def _signature(target: Callable[..., Any]) -> inspect.Signature | None:
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    if all(p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in sig.parameters.values()):
        inner = getattr(torch.nn.functional, f"_{target.__name__}", None)  # boolean_dispatch
        return _signature(inner) if inner is not None else None
    return sig


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _scalar_dtype(scalar: float | int, like: Value) -> torch.dtype:
    """Python's scalar promotion: an int keeps the tensor's dtype, a float needs a float dtype."""
    if like.dtype is not None and (like.dtype.is_floating_point or isinstance(scalar, int)):
        return like.dtype
    return torch.get_default_dtype()

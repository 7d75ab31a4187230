"""Scripted graphs in the jit front end: control flow and the Python-level ops TorchScript keeps.

A ``torch.jit.script``-ed or ``torch.jit.load``-ed model (silero-vad ships one) reaches the jit
front end as its scripted graph, not a trace: ``prim::If`` / ``prim::Loop`` blocks, ``len``,
``is None``, ``isinstance``, list appends and raised exceptions. After the graph is inlined
and the example is bound, their conditions are Python values (a sample rate attribute, a
state's length, ``dim()`` of an input), so a branch is lowered by taking it and a loop by
unrolling it. A condition that depends on tensor values cannot be lowered this way and is a
``LoweringError`` naming the node's source line.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable
from typing import Any

import torch

from torchlower.core.values import MISSING, SymDim, Value, constant
from torchlower.errors import LoweringError
from torchlower.frontends.jit_nodes import DTYPE_OF_CODE

MAX_UNROLL = 4096  # loop iterations lowered before refusing (a graph that large is a mistake)
Walk = Callable[[Iterable[torch._C.Node], dict[Any, Any]], None]


def defaults(tracer: Any, given: int) -> list[Any]:
    """The defaults of a scripted method's arguments after the ``given`` ones (``state:
    Tensor = zeros`` in silero-vad, an ``Optional`` left None); an argument without one is an
    error naming it."""
    method = getattr(tracer.mod, tracer.fn_name)
    arguments = method.schema.arguments[1 + given :]  # (self first)
    missing = [
        a.name for a in arguments if a.default_value is None and not str(a.type).startswith("Optional")
    ]
    if missing:
        raise LoweringError(f"{tracer.fn_name}() needs inputs for {', '.join(missing)} (no defaults)")
    return [a.default_value for a in arguments]


def truth(value: Any, what: str) -> bool:
    """A condition as a Python bool, or the error saying why it is not known at export."""
    if isinstance(value, Value) and value.is_const and value.const.numel() == 1:
        return bool(value.const.item())
    if isinstance(value, (bool, int, float)):
        return bool(value)
    if isinstance(value, SymDim):
        raise LoweringError(f"{what} depends on a dynamic size ({value}); make that axis static")
    if value is MISSING:
        raise LoweringError(f"{what} is computed by an op without a rule (see the ops reported missing)")
    raise LoweringError(
        f"{what} depends on tensor values, which a scripted graph cannot be specialized on;"
        " compute the condition from sizes or attributes, or trace the model instead of scripting it"
    )


def run_if(node: torch._C.Node, env: dict[Any, Any], walk: Walk, where: str) -> list[Any]:
    """``prim::If``: lower the branch the condition takes; its outputs are the node's."""
    cond = truth(env[next(iter(node.inputs()))], f"the condition of prim::If at {where}")
    block = list(node.blocks())[0 if cond else 1]
    walk(block.nodes(), env)
    return [env[v] for v in block.returnNode().inputs()]


def run_loop(node: torch._C.Node, env: dict[Any, Any], walk: Walk, where: str) -> list[Any]:
    """``prim::Loop(max_trips, condition, *carried)``: the body unrolled while the condition
    holds; the block takes ``(i, *carried)`` and returns ``(condition, *carried)``."""
    values = [env[v] for v in node.inputs()]
    trips, carried = values[0], values[2:]
    if not isinstance(trips, int):
        raise LoweringError(f"prim::Loop at {where}: its trip count {trips!r} is not known at export")
    cond = truth(values[1], f"the condition of prim::Loop at {where}")
    block = next(iter(node.blocks()))
    params = list(block.inputs())
    i = 0
    while cond and i < trips:
        if i >= MAX_UNROLL:
            raise LoweringError(f"prim::Loop at {where} runs more than {MAX_UNROLL} times; trace the model")
        env[params[0]] = i
        env.update(zip(params[1:], carried, strict=True))
        walk(block.nodes(), env)
        out = [env[v] for v in block.returnNode().inputs()]
        cond = truth(out[0], f"the condition of prim::Loop at {where}")
        carried, i = out[1:], i + 1
    return carried


_SCALAR = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "floordiv": operator.floordiv,
    "remainder": operator.mod, "div": operator.truediv, "pow": operator.pow, "neg": operator.neg,
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
    "ge": operator.ge, "__and__": operator.and_, "__or__": operator.or_, "__xor__": operator.xor,
    "Int": int, "Float": float, "Bool": bool, "abs": abs,
}  # fmt: skip  # Python arithmetic and comparisons of a scripted graph's ints, floats and strings


def python_op(node: torch._C.Node, args: list[Any], where: str) -> Any:
    """The value of a Python-level node of a scripted graph, or NotImplemented (a tensor op)."""
    kind = node.kind()
    name = kind.split("::", 1)[-1]
    if kind.startswith("aten::") and name in _SCALAR and args and all(_python_scalar(a) for a in args):
        return _SCALAR[name](*args)
    if kind in ("prim::unchecked_cast", "prim::data", "aten::detach") and not _is_tensor_op(kind, args):
        return args[0]
    if kind == "prim::Uninitialized":
        return None
    if kind == "prim::RaiseException":
        raise LoweringError(f"the scripted model raises at {where}: {args[0] if args else ''}")
    if kind == "prim::isinstance":
        return any(_is_instance(args[0], str(t)) for t in node.tys("types"))
    if kind in ("aten::__is__", "aten::__isnot__"):
        same = args[0] is args[1] or (args[0] is None and args[1] is None)
        return same if kind == "aten::__is__" else not same
    if kind == "aten::__not__":
        return not truth(args[0], f"aten::__not__ at {where}")
    if kind == "aten::__contains__" and isinstance(args[0], (list, tuple, dict)):
        return args[1] in args[0]
    if kind == "aten::len":
        if isinstance(args[0], (list, tuple, dict, str)):
            return len(args[0])
        if isinstance(args[0], Value) and args[0].shape is not None:
            return args[0].shape[0] if args[0].shape else 0
    if kind == "prim::tolist" and isinstance(args[0], Value) and args[0].is_const:
        return args[0].const.tolist()  # asteroid's ``torch.arange(1, len(x.shape)).tolist()`` dims
    if kind == "aten::dim" and isinstance(args[0], Value) and args[0].shape is not None:
        return len(args[0].shape)
    if kind == "aten::__getitem__" and isinstance(args[0], (list, tuple, dict)):
        index = args[1]
        if isinstance(index, Value) and index.is_const and index.const.numel() == 1:
            index = index.const.item()
        return args[0][index]
    if kind == "aten::slice" and isinstance(args[0], list):  # a list of sizes: ``x.shape[:-1]``
        return args[0][slice(*args[1:4])]
    if kind == "aten::add" and all(isinstance(a, list) for a in args):
        return args[0] + args[1]
    if kind == "aten::tensor" and _numbers(args[0]):  # asteroid's ``torch.tensor(x.shape)``
        dtype = DTYPE_OF_CODE.get(args[1]) if args[1] is not None else None
        return constant(torch.tensor(args[0], dtype=dtype))
    if kind == "aten::append" and isinstance(args[0], list):
        args[0].append(args[1])
        return args[0]
    if kind == "aten::format" and isinstance(args[0], str):
        return args[0].format(*args[1:])
    if kind == "aten::warn":
        return None
    if kind in ("prim::min", "prim::max") and all(isinstance(a, (int, float)) for a in _flat(args)):
        return (min if kind == "prim::min" else max)(_flat(args))
    return NotImplemented


def _numbers(value: Any) -> bool:
    """A Python number or a (nested) list of them: data ``aten::tensor`` can fold (no SymDim)."""
    if isinstance(value, list):
        return all(_numbers(v) for v in value)
    return isinstance(value, (int, float, bool)) and not isinstance(value, SymDim)


def _python_scalar(value: Any) -> bool:
    return isinstance(value, (int, float, bool, str)) and not isinstance(value, SymDim)


def _is_tensor_op(kind: str, args: list[Any]) -> bool:
    return kind == "aten::detach" and isinstance(args[0], Value)


def _flat(args: list[Any]) -> list[Any]:
    return list(args[0]) if len(args) == 1 and isinstance(args[0], (list, tuple)) else list(args)


_PYTHON_TYPES = {"int": int, "float": float, "bool": bool, "str": str, "NoneType": type(None)}


def _is_instance(value: Any, type_name: str) -> bool:
    if type_name == "Tensor":
        return isinstance(value, Value) and value is not MISSING
    if type_name.startswith(("List[", "list[")):
        return isinstance(value, list)
    if type_name.startswith(("Tuple[", "tuple[")):
        return isinstance(value, tuple)
    if type_name.startswith(("Dict[", "dict[")):
        return isinstance(value, dict)
    python = _PYTHON_TYPES.get(type_name)
    return (
        python is not None and isinstance(value, python) and not (python is int and isinstance(value, bool))
    )

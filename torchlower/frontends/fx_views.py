"""Writes through views in FX graphs (``views.py`` has the why): ``y[:, 2].zero_()``,
``y.narrow(1, 0, 1).fill_(5)``, ``z[:, 1:] = v``, ``m.diagonal().fill_(0)``.

An FX node is a view when it is basic indexing (``operator.getitem`` without index tensors) or
a call of a view op (``x.narrow(...)``, ``torch.diagonal(x)``). A write into one is scattered
back level by level to the node that owns the storage; the views of that node taken earlier
are then run again, so later readers see the write.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from torch import fx
from torch.utils import _pytree as pytree

from torchlower.core.values import Missing, Value
from torchlower.errors import LoweringError
from torchlower.frontends import pycalls, views
from torchlower.frontends.fx_index import basic_steps, fold, index_items, overload

Level = tuple[Any, str, list[Any]]  # (base value, view op, the op's other arguments)
_READ_VIEWS = views.INVERTIBLE | {"expand", "expand_as", "unfold", "as_strided", "T", "mT"}
_CANDIDATES = views.INVERTIBLE | views.ALIASING


def _name(n: fx.Node) -> str:
    if n.op == "call_method":
        return str(n.target)
    if isinstance(n.target, torch._ops.OpOverload):
        return views.op_name(n.target._schema.name)
    return getattr(n.target, "__name__", "") if n.op == "call_function" else ""


def is_view(interp: Any, n: fx.Node) -> bool:
    """Whether ``n`` reads through a view of its first argument (a recompute keeps it current)."""
    if n.op == "call_function" and n.target is operator.getitem:
        base = interp.env.get(n.args[0]) if isinstance(n.args[0], fx.Node) else None
        index = interp.map_nodes_to_values(n.args[1], n)
        return isinstance(base, Value) and not any(isinstance(i, Value) for i in pytree.tree_leaves(index))
    if n.op in ("call_method", "call_function") and _name(n) in views.ALIASING:
        first = n.args[0] if n.args else None
        return views.aliases(_name(n), interp.env.get(n), interp.env.get(first))
    return n.op in ("call_method", "call_function") and _name(n) in _READ_VIEWS


def _maybe_view(n: fx.Node) -> bool:
    if n.op == "call_function" and n.target is operator.getitem:
        return True
    return n.op in ("call_method", "call_function") and _name(n) in _CANDIDATES


def levels(interp: Any, n: fx.Node) -> list[Level] | None:
    """The view ops ``n`` applies to its first argument, outermost first; None if not a view."""
    if not _maybe_view(n):
        return None
    args, kwargs = interp.fetch_args_kwargs_from_env(n)
    if not args or not isinstance(args[0], Value):
        return None
    x, where = args[0], interp._where()
    if n.op == "call_function" and n.target is operator.getitem:
        items = index_items(x, args[1], where)
        if any(isinstance(i, Value) for i in items):
            return None
        steps = basic_steps(x, items, where)
        out: list[Level] = []
        for op, rest in steps:
            out.append((x, views.op_name(op), rest))
            x = interp.session.apply(op, [x, *rest], where, None, fold(overload(op), (x, *rest), {}))
        return out
    if n.op == "call_method":
        call = pycalls.resolve_method(str(n.target), args, kwargs)
    elif n.op == "call_function":
        call = pycalls.resolve_function(n.target, args, kwargs)
    else:
        return None
    if call.bound is None:
        return None
    op = views.op_name(call.bound.key)
    if not views.aliases(op, interp.env.get(n), call.bound.args[0]):
        return None
    return [(call.bound.args[0], op, list(call.bound.args[1:]))]


def write_through(interp: Any, n: fx.Node, target: fx.Node, result: Any) -> None:
    """``n`` wrote ``result`` into ``target``: update the storage owner and its views."""
    node, new = target, result
    while isinstance(node, fx.Node) and not isinstance(new, Missing):
        found = levels(interp, node)
        if found is None:
            _refuse_hidden_write(n, node)
            break
        for base, op, args in reversed(found):
            new = views.write_back(interp.session, interp._where(), base, op, args, new)
        node = node.args[0]
    if not isinstance(node, fx.Node):
        return
    old, interp.env[node] = interp.env.get(node), new
    _refresh(interp, node, old, n)


def _refuse_hidden_write(writer: fx.Node, view: fx.Node) -> None:
    """A write through a view with no inverse (``unfold``, ``expand``) into a base read later."""
    if not (view.op in ("call_method", "call_function") and _name(view) in _READ_VIEWS):
        return
    base = view.args[0] if view.args else None
    order = {m: i for i, m in enumerate(writer.graph.nodes)}
    if isinstance(base, fx.Node) and any(order[u] > order[writer] for u in base.users):
        raise LoweringError(
            f"in-place {writer.target} at {writer.name} writes through a view ({_name(view)}) into a "
            "tensor read later, and that view has no functional inverse; write into the tensor itself"
        )


def _refresh(interp: Any, root: fx.Node, old_root: Any, writer: fx.Node) -> None:
    """Run again the views of ``root`` (and of those) taken before ``writer``; earlier in-place
    results on them are aliases and take the new value. Aliasing ops (``to``, ``contiguous``)
    count as views when they were, judged on the values from before the write."""
    before = {root: old_root}
    current = interp._node
    try:
        for m in root.graph.nodes:
            if m is writer:
                break
            first = m.args[0] if m.args else None
            if first not in before or m not in interp.env:
                continue
            previous = interp.env[m]
            aliasing = _name(m) in views.ALIASING
            if m in interp.inplace_nodes or (aliasing and views.aliases(_name(m), previous, before[first])):
                interp.env[m] = interp.env[first]
            elif not aliasing and is_view(interp, m):
                interp._node = m
                interp.env[m] = getattr(interp, m.op)(m.target, *interp.fetch_args_kwargs_from_env(m))
            else:
                continue
            before[m] = previous
    finally:
        interp._node = current

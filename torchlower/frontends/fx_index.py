"""Python indexing in FX graphs: ``x[...]`` and ``x[...] = v`` as ATen calls in schema order.

FX records ``operator.getitem(x, index)`` / ``operator.setitem(x, index, v)`` with the Python
index; TorchScript would have emitted ``select`` / ``slice`` / ``unsqueeze`` / ``index`` /
``index_put_``. The same ops are emitted here, so rules see what every front end sends.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from torchlower.core.values import Value, constant
from torchlower.errors import LoweringError
from torchlower.frontends.aten_ops import overload
from torchlower.frontends.session import Meta, Session

Step = tuple[str, list[Any]]


def lower_getitem(session: Session, x: Value, index: Any, where: str, metas: list[Meta] | None) -> Any:
    """``x[index]``; every step but the last gets its shape from a meta-tensor probe (from the
    rules themselves when ``x`` has dynamic sizes; the last step's comes from the graph)."""
    steps = basic_steps(x, index_items(x, index, where), where) or [
        ("aten::slice.Tensor", [0, None, None, 1])
    ]
    result: Any = x
    probe = None if x.is_symbolic else torch.empty(static(x), dtype=x.dtype, device="meta")
    for n, (op, rest) in enumerate(steps):
        aten = overload(op)
        last = n == len(steps) - 1
        if not last and probe is not None:
            probe = aten(probe, *[_meta_arg(r) for r in rest])
        meta = metas if last else None if probe is None else [(probe.dtype, tuple(probe.shape))]
        result = session.apply(op, [result, *rest], where, meta, fold(aten, (result, *rest), {}))
    return result


def lower_setitem(session: Session, x: Value, index: Any, value: Any, where: str) -> Any:
    """``x[index] = value``: the new value of ``x``.

    The slices, integers and ``None`` of the index select a view of ``x``; ``value`` is copied
    into it (``copy``, or ``index_put`` for the index tensors), and the view is scattered back
    into ``x`` (``views.write_back``).
    """
    from torchlower.frontends import views

    items = index_items(x, index, where)
    steps = basic_steps(x, items, where)
    if not isinstance(value, Value):
        value = constant(torch.tensor(value, dtype=x.dtype))
    indexed = steps[-1] if steps and steps[-1][0] == "aten::index.Tensor" else None
    if indexed is not None:
        steps = steps[:-1]
    bases = [x]
    for op, rest in steps:
        step = fold(overload(op), (bases[-1], *rest), {})
        bases.append(session.apply(op, [bases[-1], *rest], where, None, step))
    view = bases.pop()
    if indexed is not None:
        args = [view, indexed[1][0], value, False]
        new = session.apply("aten::index_put", args, where, None, fold(torch.ops.aten.index_put, args, {}))
    else:
        args = [view, value, False]
        new = session.apply("aten::copy", args, where, None, fold(torch.ops.aten.copy, args, {}))
    for (op, rest), base in reversed(list(zip(steps, bases, strict=True))):
        new = views.write_back(session, where, base, views.op_name(op), rest, new)
    return new


def index_items(x: Value, index: Any, where: str) -> list[Any]:
    """The index as a list with its Ellipsis expanded to full slices."""
    items = list(index) if isinstance(index, tuple) else [index]
    if sum(i is Ellipsis for i in items) > 1:
        raise LoweringError(f"{where}: an index may hold one Ellipsis, got {index!r}")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        used = sum(_dims_used(i) for i in items if i is not Ellipsis)
        items[at : at + 1] = [slice(None)] * (x.rank - used)
    return items


def _dims_used(item: Any) -> int:
    if item is None:
        return 0
    if isinstance(item, Value) and item.dtype == torch.bool:
        return item.rank
    return 1


def basic_steps(x: Value, items: list[Any], where: str) -> list[Step]:
    """Slices first (they keep every dim), then one ``index.Tensor`` holding all index tensors.

    With index tensors, integers are index tensors too (NumPy's rule), so dims never shift.
    """
    tensors = any(isinstance(i, Value) for i in items)
    steps: list[Step] = []
    indices: list[Any] = []
    dim = 0
    for item in items:
        if item is None and not tensors:
            steps.append(("aten::unsqueeze", [dim]))
            dim += 1
        elif isinstance(item, int) and not isinstance(item, bool):
            if tensors:
                indices.append(constant(torch.tensor(item)))
                dim += 1
            else:
                steps.append(("aten::select.int", [dim, item]))
        elif isinstance(item, slice):
            if item != slice(None):
                steps.append(("aten::slice.Tensor", [dim, item.start, item.stop, item.step or 1]))
            indices.append(None)
            dim += 1
        elif isinstance(item, Value):
            indices.append(item)
            dim += _dims_used(item)
        else:
            raise LoweringError(f"{where}: indexing with {items!r} is not supported")
    while indices and indices[-1] is None:
        indices.pop()
    if tensors:
        steps.append(("aten::index.Tensor", [indices]))
    return steps


def fold(target: Any, args: Any, kwargs: dict[str, Any]) -> Any:
    """Folding runs the call exactly as recorded, on the constants' tensors."""

    def call(*_: Any) -> Any:
        unwrap = lambda a: a.const if isinstance(a, Value) else a  # noqa: E731
        return target(*pytree.tree_map(unwrap, tuple(args)), **pytree.tree_map(unwrap, dict(kwargs)))

    return call


def static(x: Value) -> tuple[int, ...]:
    try:
        return x.static_shape()
    except ValueError as exc:
        raise LoweringError(str(exc)) from exc


def _meta_arg(arg: Any) -> Any:
    if isinstance(arg, Value):
        return torch.empty(static(arg), dtype=arg.dtype, device="meta")
    if isinstance(arg, list):
        return [_meta_arg(a) for a in arg]
    return arg

"""Traces that differ by a pad or a slice the model applies only on one side of a size branch.

SEW's upsampling ends with ``if x.shape[1] < n: x = pad(x, (0, 0, 0, n - x.shape[1]))``: where the
encoder's length is odd the trace holds a pad of 1, where it is even no pad at all, so the traces
cannot be compared node by node. Aligned with the missing pad read as a pad of 0, the traces agree,
and the pad's amount is lowered as *the fitted output size minus the input size* (``jit.py``):
a size expression that is 1 where the model pads and 0 where it does not, so the archive is right
on both sides of the branch. That holds only when the pad's output size is one expression over
every capture (the size fitter proves it, or refuses the axis), and the pad rule refuses an amount
that could be negative (a crop, which the model never does).

EnCodec's decoder is the mirror case: ``if mask.shape[-1] < y.shape[-1]: y = y[..., :mask.shape[-1]]``
crops only where T is not a multiple of its hop, so the example's trace may lack the slice. The
trace that holds every other one (``superset``) is then the one lowered; a slice some traces lack
ends at its start plus its fitted output size. Traces that differ otherwise still raise "the traced
graph changes with it".
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from torchlower.errors import LoweringError

PADS = ("aten::pad", "aten::constant_pad_nd")
OPTIONAL = (*PADS, "aten::slice")  # ops that are an identity at some size (a pad of 0, a full slice)
# what builds a pad's amounts in a trace: constants, lists and integer math on sizes
_SIZE_MATH = {
    "prim::Constant", "prim::ListConstruct", "prim::NumToTensor", "aten::size", "aten::Int",
    "aten::ScalarImplicit", "aten::add", "aten::sub", "aten::mul", "aten::floordiv", "aten::neg",
    "aten::remainder", "aten::floor_divide",
}  # fmt: skip


def align(master: Sequence[Any], other: Sequence[Any]) -> tuple[list[Any], set[int]] | None:
    """``other``'s nodes at ``master``'s indices (None where a pad of ``master`` and its own
    arguments are missing) and the indices of those pads; None when the traces differ otherwise."""
    a = [_key(n) for n in master]
    b = [_key(n) for n in other]
    if a == b:
        return list(other), set()
    out: list[Any] = [None] * len(master)
    missing: set[int] = set()
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            out[i1:i2] = other[j1:j2]
        elif tag == "delete":
            missing.update(range(i1, i2))
        else:
            return None
    pads = {i for i in missing if master[i].kind() in OPTIONAL}
    if not pads:
        return None
    arguments = pad_arguments(master, pads)
    for i in sorted(missing - pads - arguments):
        stand_in = _constant_in(master, out, i)  # a constant the other trace shares elsewhere
        if stand_in is None:
            return None
        out[i] = stand_in
    return out, pads


def superset(nodes: Sequence[Sequence[Any]]) -> int:
    """The index of a trace every other one aligns into (the example's, 0, when it does)."""
    for k in sorted(range(len(nodes)), key=lambda k: (k != 0, -len(nodes[k]))):
        if all(g == k or align(nodes[k], ns) is not None for g, ns in enumerate(nodes)):
            return k
    return 0


def _constant_in(master: Sequence[Any], aligned: Sequence[Any], i: int) -> Any:
    """The node of the other trace that feeds a user of ``master[i]`` (a constant) at the same
    argument, None when ``master[i]`` is not a constant or no such user was aligned."""
    if master[i].kind() != "prim::Constant":
        return None
    index = {n: k for k, n in enumerate(master)}
    for use in master[i].output().uses():
        other = aligned[index[use.user]] if use.user in index else None
        if other is not None and other.kind() == use.user.kind():
            found = other.inputsAt(use.offset).node()
            return found if found.kind() == "prim::Constant" else None
    return None


def pad_arguments(master: Sequence[Any], pads: set[int]) -> set[int]:
    """Indices of the nodes that only build the pads' arguments: amount lists and the size
    arithmetic behind them (``n - x.shape[1]``), mode, value."""
    index = {n: i for i, n in enumerate(master)}
    found: set[int] = set()
    todo = [master[p] for p in pads]
    while todo:
        node = todo.pop()
        for k, v in enumerate(node.inputs()):
            producer = v.node()
            if (node.kind() in PADS and k == 0) or producer not in index:
                continue  # the padded tensor itself, or a graph input
            if producer.kind() not in _SIZE_MATH:
                continue
            users = {u.user for out in producer.outputs() for u in out.uses()}
            if all(index.get(u) in pads or index.get(u) in found for u in users):
                found.add(index[producer])
                todo.append(producer)
    return found


def _key(node: Any) -> str:
    """What must match between traces: the op, its module scope and, but for constants (a trace
    creates one where it is first used), its source line."""
    if node.kind() == "prim::Constant":
        return f"{node.kind()}|{node.scopeName()}"
    try:
        line = node.sourceRange().splitlines()[0]
    except (RuntimeError, IndexError):
        line = ""
    return f"{node.kind()}|{node.scopeName()}|{line}"


def resized(kind: str, args: list[Any], target: Sequence[Any], where: str) -> list[Any]:
    """The arguments of an optional op (``OPTIONAL``) that give the fitted output shape ``target``."""
    if kind in PADS:
        return [args[0], amounts(args[0], args[1], target, where), *args[2:]]
    x, dim, start, _, step = args
    axis = dim % len(x.shape)
    if step != 1 or not isinstance(start, (int, type(None))) or (start or 0) < 0:
        raise LoweringError(f"slice at {where}: only some traces slice, with step {step} from {start}")
    return [x, dim, start, (start or 0) + target[axis], step]


def amounts(x: Any, pad: Sequence[Any], target: Sequence[Any], where: str) -> list[Any]:
    """``pad`` (torch's order: last axis first, (before, after) pairs) with each padded side's
    amount replaced by ``target``'s size minus ``x``'s on that axis."""
    rank = len(x.shape)
    out = list(pad)
    for k in range(len(pad) // 2):
        axis = rank - 1 - k
        grow = target[axis] - x.shape[axis]
        lo, hi = pad[2 * k], pad[2 * k + 1]
        if lo != 0 and hi != 0:
            raise LoweringError(
                f"pad at {where}: both sides of axis {axis} are padded in the example's trace and some"
                " other trace has no pad; make that size static"
            )
        if lo == 0 and hi == 0:
            if grow != 0:
                raise LoweringError(f"pad at {where}: axis {axis} grows by {grow} in some trace")
            continue
        out[2 * k + (1 if lo == 0 else 0)] = grow
    return out

"""Writes through views: ``x[a:b] = v``, ``y[:, 2].zero_()``, ``m.diagonal().fill_(0)``.

PyTorch mutates the base tensor's storage through the view, so every later reader of the base
(and of any other view of it) sees the write. The artifact is functional: the new value of the
view is scattered back into its base with the view's inverse (``slice_scatter``,
``select_scatter``, ``diagonal_scatter``, an inverse reshape or permutation), level by level up
to the tensor that owns the storage. The front ends (``jit.py``, ``fx.py``) then rebind that
base and recompute the views of it that are read later.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torchlower.core.values import MISSING, Missing, Value, normalize_dim
from torchlower.errors import LoweringError
from torchlower.frontends.aten_ops import overload
from torchlower.frontends.session import Session

# views whose write-back is defined below (ATen names without the overload)
INVERTIBLE = {
    "slice", "select", "narrow", "diagonal", "view", "reshape", "view_as", "reshape_as", "unsqueeze",
    "squeeze", "flatten", "unflatten", "transpose", "t", "permute", "swapaxes", "swapdims", "alias",
    "detach", "movedim", "moveaxis",
}  # fmt: skip
# ops that return their input itself when nothing changes (``x.to(x.dtype)``, ``contiguous`` of a
# contiguous tensor): views then, copies otherwise — a front end treats them as views only when
# the rule returned the same value (same name)
ALIASING = {"contiguous", "to", "type_as"}


def op_name(key: str) -> str:
    """``aten::slice.Tensor`` → ``slice``."""
    return key.split("::", 1)[-1].split(".", 1)[0]


def write_back(session: Session, where: str, base: Any, op: str, args: Sequence[Any], view: Any) -> Any:
    """The new value of ``base`` once its view ``op(base, *args)`` holds ``view``.

    ``args`` are the view op's arguments after ``base``, in ATen schema order.
    """
    if isinstance(base, Missing) or isinstance(view, Missing):
        return MISSING
    meta = [(base.dtype, base.shape)]

    def call(key: str, call_args: list[Any]) -> Any:
        aten = overload(key)
        return session.apply(key, call_args, where, meta, _fold(aten))

    if op == "slice":
        dim, start, end, step = (list(args) + [0, None, None, 1][len(args) :])[:4]
        return call("aten::slice_scatter", [base, view, dim, start, end, step])
    if op == "narrow":
        dim, start, length = args
        start = int(start.const) if isinstance(start, Value) and start.is_const else start
        return call("aten::slice_scatter", [base, view, dim, start, start + length, 1])
    if op == "select":
        return call("aten::select_scatter", [base, view, args[0], args[1]])
    if op == "diagonal":
        offset, dim1, dim2 = (list(args) + [0, 0, 1][len(args) :])[:3]
        return call("aten::diagonal_scatter", [base, view, offset, dim1, dim2])
    if op in ("transpose", "swapaxes", "swapdims"):
        return call("aten::transpose.int", [view, args[0], args[1]])
    if op == "t":
        return call("aten::t", [view]) if base.rank == 2 else view
    if op == "permute":
        dims = [normalize_dim(d, base.rank) for d in args[0]]
        return call("aten::permute", [view, [dims.index(i) for i in range(base.rank)]])
    if op in ("movedim", "moveaxis"):
        variant = "int" if isinstance(args[0], int) else "intlist"
        return call(f"aten::{op}.{variant}", [view, args[1], args[0]])
    if op in ("alias", "detach") or op in ALIASING:
        return view
    if base.shape is None:
        raise LoweringError(f"{where}: a write through {op} into a tensor of unknown shape")
    return call("aten::reshape", [view, list(base.shape)])  # view / reshape / (un)squeeze / flatten…


def aliases(op: str, view: Any, base: Any) -> bool:
    """Whether ``view = op(base, …)`` shares ``base``'s storage (so a write through it reaches ``base``)."""
    if op in INVERTIBLE:
        return True
    return op in ALIASING and isinstance(view, Value) and isinstance(base, Value) and view.name == base.name


def _fold(aten: Any) -> Any:
    def fold(*args: Any) -> Any:
        return aten(*args)

    return fold

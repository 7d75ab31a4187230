"""Small helpers shared by rule families (rank alignment, constants, shape attributes)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import torch

from torchlower.core.values import Dim, Shape, Value, constant
from torchlower.nnef.builder import NNEFBuilder

Builder = NNEFBuilder
Scalar = float | int | bool
Operand = Value | Scalar


def rank_of(x: Operand) -> int:
    return x.rank if isinstance(x, Value) else 0


def shape_of(x: Operand) -> Shape:
    if isinstance(x, Value):
        if x.shape is None:
            raise ValueError(f"shape of {x.name} is unknown")
        return x.shape
    return ()


def unsqueeze_to(b: Builder, x: Operand, rank: int) -> Operand:
    """Prepend unit dims so ``x`` has ``rank`` (tract broadcasts only equal ranks safely)."""
    if not isinstance(x, Value) or x.rank >= rank:
        return x
    if x.is_const and x.const.dim() == 0 and x.const.is_floating_point():  # printed as a literal
        return x
    extra = rank - x.rank
    if x.is_const:
        return constant(x.const.reshape((1,) * extra + tuple(x.const.shape)), label=x.label)
    shape = (1,) * extra + shape_of(x)
    if any(not isinstance(d, int) for d in shape):  # tract 0.23 mis-broadcasts unsqueezed symbolic ranges
        return b.call("reshape", [x], {"shape": list(shape)}, dtype=x.dtype, shape=shape)
    return b.call("unsqueeze", [x], {"axes": list(range(extra))}, dtype=x.dtype, shape=shape)


def align_ranks(b: Builder, *xs: Operand) -> list[Operand]:
    rank = max(rank_of(x) for x in xs)
    return [unsqueeze_to(b, x, rank) for x in xs]


def as_const(x: Operand, dtype: torch.dtype) -> Value:
    return constant(torch.tensor(x, dtype=dtype)) if not isinstance(x, Value) else x


def reshape(b: Builder, x: Value, shape: Sequence[Dim]) -> Value:
    if x.is_const:
        return constant(x.const.reshape([int(d) for d in shape]))
    if not shape:  # tract cannot read `shape = []`; every dim is 1, so squeeze them all
        return b.call("squeeze", [x], {"axes": list(range(x.rank))}, dtype=x.dtype, shape=())
    return b.call("reshape", [x], {"shape": list(shape)}, dtype=x.dtype, shape=tuple(shape))


def channel_param(param: Value, rank: int, axis: int = 1) -> Value:
    """A per-channel constant reshaped to broadcast along ``axis`` of a rank-``rank`` tensor."""
    shape = [1] * rank
    shape[axis] = -1
    return constant(param.const.reshape(shape), label=param.label)


def pairs(values: Sequence[int]) -> list[tuple[int, int]]:
    return [(int(v), int(v)) for v in values]


# integer types narrower than i64: torch converts a float to them by truncation then wraps
# (-3.7 -> u8 253, 300.2 -> u8 44); tract's float cast saturates (-3.7 -> 0, 300.2 -> 255) but
# its integer casts wrap as torch does, so such a float goes through i64 first
_WRAPPED = (torch.uint8, torch.int8, torch.int16, torch.uint16, torch.uint32)


def cast(b: Builder, x: Value, dtype: torch.dtype) -> Value:
    """``x`` as ``dtype``: constants are converted at export time, tensors with one cast."""
    if x.dtype == dtype:
        return x
    if x.is_const:
        return constant(x.const.to(dtype))
    if dtype in _WRAPPED and x.dtype is not None and x.dtype.is_floating_point:
        x = b.call("tract_core_cast", [x], {"to": "i64"}, dtype=torch.int64, shape=x.shape)
    return b.call("tract_core_cast", [x], {"to": b.dtype_name(dtype)}, dtype=dtype, shape=x.shape)


def broadcast_shapes(*shapes: Shape) -> Shape:
    """``torch.broadcast_shapes`` that keeps symbolic dims (a size-1 dim takes the other's)."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(rank):
        dims = [s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0]
        big = [d for d in dims if not (isinstance(d, int) and d == 1)]
        static = [d for d in big if isinstance(d, int)]
        out.append(static[0] if static else big[0] if big else 1)
    return tuple(out)


def _is_zero(x: Operand) -> bool:
    if isinstance(x, Value):
        return x.is_const and x.const.numel() == 1 and bool(x.const.reshape(()) == 0)
    return not isinstance(x, bool) and x == 0


def tract_operands(b: Builder, op: str, x: Operand, y: Operand) -> tuple[str, Operand, Operand]:
    """``op(x, y)`` (promoted, rank-aligned) as tract computes it like torch: every binary helper
    calls this last; ``ieee_zero`` and ``distinct_factors`` say why."""
    return distinct_factors(b, *ieee_zero(b, op, x, y))


def ieee_zero(b: Builder, op: str, x: Operand, y: Operand) -> tuple[str, Operand, Operand]:
    """A float ``x * 0`` or ``0 / y`` rewritten so tract keeps IEEE NaN.

    tract folds a product with a constant 0 (and ``0 / y``) to 0, but ``inf * 0``, ``NaN * 0``
    and ``0 / 0`` are NaN in torch. ``x - x`` is 0 where x is finite and NaN elsewhere, and is
    not folded: ``x * 0`` becomes ``x * (x - x)`` (sign of zero kept), ``0 / y`` becomes ``r * (r - r)``
    with ``r = 1 / y``. ``x / ±0`` becomes ``x * ±inf``: tract merges equal constants, and
    ``-0.0 == 0.0``, so a divisor's sign of zero is not safe in the graph. Operands are already
    promoted and rank-aligned.
    """
    if op not in ("mul", "div"):
        return op, x, y
    if op == "mul" and _is_zero(x):
        x, y = y, x
    floating = isinstance(x, Value) and x.dtype is not None and x.dtype.is_floating_point
    if op == "div" and _is_zero(y) and floating:
        return "mul", x, -math.inf if _negative_zero(y) else math.inf
    live = x if op == "mul" else y
    if not isinstance(live, Value) or live.is_const or live.dtype is None or not live.dtype.is_floating_point:
        return op, x, y
    if op == "div" and _is_zero(x):
        op, x, y = "mul", b.call("recip", [live], dtype=live.dtype, shape=live.shape), 0.0
    if op == "mul" and _is_zero(y):
        zero = b.call("sub", [x, x], dtype=x.dtype, shape=x.shape)
        if _negative_zero(y):  # x * -0.0 flips the sign of the zero
            zero = b.call("neg", [zero], dtype=x.dtype, shape=x.shape)
        return "mul", x, zero
    return op, x, y


def distinct_factors(b: Builder, op: str, x: Operand, y: Operand) -> tuple[str, Operand, Operand]:
    """An integer ``x * x`` as ``x * (x + 1) - x``: tract rewrites a product of one tensor with
    itself to ``square``, which has no integer kernels ("Square does not support I64"). Exact
    in wrapping integer arithmetic, like the product itself."""
    same = isinstance(x, Value) and isinstance(y, Value) and x.name == y.name
    if op != "mul" or not same or x.dtype is None:
        return op, x, y
    if x.dtype.is_floating_point or x.dtype == torch.bool:
        return op, x, y
    one = constant(torch.ones((1,) * x.rank, dtype=x.dtype))
    shifted = b.call("add", [x, one], dtype=x.dtype, shape=x.shape)
    return "sub", b.call("mul", [x, shifted], dtype=x.dtype, shape=x.shape), x


def _negative_zero(z: Operand) -> bool:
    v = z.const.reshape(()) if isinstance(z, Value) else torch.tensor(float(z))
    return bool(torch.signbit(v.float()))


def rank0(b: Builder, y: Value, rank: int) -> Value:
    """``y`` back to rank 0 when every operand was: integer scalars are written as ``[1]``-shaped
    typed constants (an int literal is a TDim in tract), which would make the result rank 1."""
    if rank == 0 and y.rank == 1:
        return b.call("squeeze", [y], {"axes": [0]}, dtype=y.dtype, shape=())
    return y


def size_tensor(b: Builder, d: Dim, dtype: torch.dtype = torch.int64) -> Value:
    """A rank-0 tensor holding the size ``d`` (a symbolic size read at run time: a one-element
    ``tract_core_range`` over ``[d, d + 1)``), for a size used as a tensor operand (``x * T``)."""
    if isinstance(d, int):
        return constant(torch.tensor(d, dtype=dtype))
    one = b.call("tract_core_range", [d, d + 1, 1], dtype=torch.int64, shape=(1,))
    one = b.call("tract_core_cast", [one], {"to": "i64"}, dtype=torch.int64, shape=(1,))
    out = cast(b, b.call("squeeze", [one], {"axes": [0]}, dtype=torch.int64, shape=()), dtype)
    return replace(out, series=(d, 0)) if out.dtype == torch.int64 else out

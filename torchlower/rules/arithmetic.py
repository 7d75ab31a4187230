"""Binary arithmetic and clamping, with torch's type promotion and NumPy broadcasting.

Operands may be tensors or Python scalars on either side. Promotion is decided with torch
itself at export time, so an int tensor plus ``0.5`` becomes a float op; scalars print as
literals of the result type and constant tensors are converted once, never cast in the graph.
"""

from __future__ import annotations

import torch

from torchlower.core.values import Shape, SymDim, Value, constant
from torchlower.errors import LoweringError
from torchlower.rules import nan, rule
from torchlower.rules.common import (
    Builder,
    Operand,
    Scalar,
    align_ranks,
    cast,
    rank0,
    rank_of,
    shape_of,
    size_tensor,
    tract_operands,
)
from torchlower.rules.division import rounded_quotient


def result_dtype(*xs: Operand | None) -> torch.dtype:
    """torch's promotion over tensors (dimensioned or 0-d) and Python scalars."""
    protos = [_proto(x) for x in xs if x is not None]
    acc = protos[0]
    for p in protos[1:]:
        dtype = torch.result_type(acc, p)
        if any(isinstance(q, torch.Tensor) and q.dim() for q in (acc, p)):
            acc = torch.empty((0,), dtype=dtype)
        elif any(isinstance(q, torch.Tensor) for q in (acc, p)):
            acc = torch.empty((), dtype=dtype)
        else:
            acc = torch.zeros((), dtype=dtype).item()
    return acc.dtype if isinstance(acc, torch.Tensor) else torch.tensor(acc).dtype


def _proto(x: Operand) -> torch.Tensor | Scalar:
    if isinstance(x, SymDim):  # a size promotes like the Python int it stands for
        return 0
    if isinstance(x, Value):
        if x.dtype is None:
            raise ValueError(f"dtype of {x.name} is unknown")
        return torch.empty((), dtype=x.dtype) if x.shape == () else torch.empty((0,), dtype=x.dtype)
    return x


def as_operand(b: Builder, x: Operand, dtype: torch.dtype) -> Operand:
    """``x`` converted to ``dtype``: float/bool scalars as literals, tensors cast once.

    tract reads integer literals as its symbolic-dim type (TDim), which then leaks into the
    result; integer scalars therefore become one-element constants of the exact dtype.
    """
    integer = not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)
    if isinstance(x, Value):
        x = cast(b, x, dtype)
        return constant(x.const.reshape(1)) if integer and x.is_const and x.const.dim() == 0 else x
    if integer:
        return constant(torch.tensor([x], dtype=dtype))
    return bool(x) if dtype == torch.bool else float(x)


def broadcast_shape(*xs: Operand) -> Shape | None:
    shapes = [shape_of(x) for x in xs if isinstance(x, Value)]
    if any(s is None for s in shapes):
        return None
    rank = max((len(s) for s in shapes), default=0)
    out: list = [1] * rank
    for s in shapes:
        for i, d in enumerate(s, start=rank - len(s)):
            out[i] = d if out[i] == 1 else out[i]
    return tuple(out)


def binary(b: Builder, op: str, x: Operand, y: Operand, dtype: torch.dtype | None = None) -> Value:
    """Emit ``op(x, y)`` after promoting to ``dtype`` (torch's result type by default)."""
    x, y = (size_tensor(b, v) if isinstance(v, SymDim) else v for v in (x, y))  # ``x * T``: a size
    dtype = dtype or result_dtype(x, y)
    rank = max(rank_of(x), rank_of(y))
    x, y = as_operand(b, x, dtype), as_operand(b, y, dtype)
    shape = broadcast_shape(x, y)
    x, y = align_ranks(b, x, y)
    out_dtype = torch.bool if op in ("lt", "gt", "le", "ge", "eq", "ne") else dtype
    op, x, y = tract_operands(b, op, x, y)
    return rank0(b, b.call(op, [x, y], dtype=out_dtype, shape=shape), rank)


def _scaled(b: Builder, y: Operand, alpha: Scalar) -> Operand:
    if alpha == 1:
        return y
    if not isinstance(y, Value):
        return y * alpha
    if y.is_const:
        return constant(y.const * alpha)
    return binary(b, "mul", y, alpha)


@rule("aten::add.Tensor", "aten::add.Scalar", "aten::add_.Tensor", "aten::add_.Scalar")
def add(b: Builder, x: Operand, y: Operand, alpha: Scalar = 1) -> Value:
    """add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"""
    return binary(b, "add", x, _scaled(b, y, alpha), result_dtype(x, y, alpha if alpha != 1 else None))


@rule("aten::sub.Tensor", "aten::sub.Scalar", "aten::sub_.Tensor", "aten::sub_.Scalar")
def sub(b: Builder, x: Operand, y: Operand, alpha: Scalar = 1) -> Value:
    """sub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"""
    return binary(b, "sub", x, _scaled(b, y, alpha), result_dtype(x, y, alpha if alpha != 1 else None))


@rule("aten::rsub.Tensor", "aten::rsub.Scalar")
def rsub(b: Builder, x: Operand, y: Operand, alpha: Scalar = 1) -> Value:
    """rsub.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor: other - alpha * self"""
    return binary(b, "sub", y, _scaled(b, x, alpha), result_dtype(x, y, alpha if alpha != 1 else None))


@rule("aten::mul.Tensor", "aten::mul.Scalar", "aten::mul_.Tensor", "aten::mul_.Scalar")
def mul(b: Builder, x: Operand, y: Operand) -> Value:
    """mul.Tensor(Tensor self, Tensor other) -> Tensor"""
    return binary(b, "mul", x, y)


@rule(
    "aten::div.Tensor",
    "aten::div.Scalar",
    "aten::div.Tensor_mode",
    "aten::div.Scalar_mode",
    "aten::div_.Tensor",
    "aten::div_.Scalar",
    "aten::div_.Tensor_mode",
    "aten::div_.Scalar_mode",
)
def div(b: Builder, x: Operand, y: Operand, rounding_mode: str | None = None) -> Value:
    """div.Tensor_mode(Tensor self, Tensor other, *, str? rounding_mode) -> Tensor

    True division promotes integers to float; "trunc" and "floor" round the quotient.
    """
    dtype = result_dtype(x, y)
    integral = not (dtype.is_floating_point or dtype.is_complex)
    if rounding_mode is None:
        return binary(b, "div", x, y, torch.get_default_dtype() if integral else dtype)
    if not integral and rounding_mode in ("trunc", "floor"):  # exact, unlike tract's x * recip(y)
        return rank0(b, rounded_quotient(b, x, y, dtype, rounding_mode), max(rank_of(x), rank_of(y)))
    q = binary(b, "div", x, y, dtype)  # integer division in tract truncates
    if rounding_mode == "trunc":
        return q
    if rounding_mode == "floor":
        # truncation differs from floor when the remainder is non-zero with the divisor's other sign
        rest = binary(b, "sub", x, binary(b, "mul", q, y, dtype), dtype)
        fix = binary(b, "lt", binary(b, "mul", rest, y, dtype), 0, dtype)
        return b.call("select", [fix, binary(b, "sub", q, 1, dtype), q], dtype=dtype, shape=q.shape)
    raise LoweringError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")


@rule("aten::clamp", "aten::clip", "aten::clamp_", "aten::clip_")
def clamp(b: Builder, x: Value, lo: Operand | None, hi: Operand | None) -> Value:
    """clamp(Tensor self, Scalar? min=None, Scalar? max=None) -> Tensor  (also .Tensor bounds)

    ``None`` is unbounded; ``0``/``0.0`` is a bound. ``max`` is applied last, so ``min > max``
    gives ``max`` everywhere like torch. A float NaN in ``x`` or a tensor bound is the result, as
    in torch (tract's ``max`` / ``min`` return the other operand: ``rules/nan.py``).
    """
    if lo is None and hi is None:
        raise LoweringError("clamp: at least one of min and max must be given (both are None)")
    dtype = result_dtype(x, lo, hi)
    y: Value = cast(b, x, dtype)
    if (
        nan.is_float(x)
        and dtype == x.dtype
        and all(v is None or isinstance(v, (int, float)) for v in (lo, hi))
    ):
        return nan.bounded(b, x, None if lo is None else float(lo), None if hi is None else float(hi))
    if lo is not None:
        y = nan.kept(b, lo, binary(b, "max", y, lo, dtype))
    if hi is not None:
        y = nan.kept(b, hi, binary(b, "min", y, hi, dtype))
    return nan.kept(b, x, y)


@rule("aten::clamp_min", "aten::clamp_min_")
def clamp_min(b: Builder, x: Value, lo: Operand) -> Value:
    """clamp_min(Tensor self, Scalar min) -> Tensor"""
    return clamp(b, x, lo, None)


@rule("aten::clamp_max", "aten::clamp_max_")
def clamp_max(b: Builder, x: Value, hi: Operand) -> Value:
    """clamp_max(Tensor self, Scalar max) -> Tensor"""
    return clamp(b, x, None, hi)

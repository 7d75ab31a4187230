"""Pointwise losses with torch's reduction enum (0 none, 1 mean, 2 sum) applied over every dim."""

from __future__ import annotations

from torchlower.core.values import Value
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder
from torchlower.rules.math import binary, select, unary
from torchlower.rules.reduce import mean, sum_


def _reduce(b: Builder, loss: Value, reduction: int) -> Value:
    if reduction == 0:
        return loss
    if reduction == 1:
        return mean(b, loss)
    if reduction == 2:
        return sum_(b, loss)
    raise LoweringError(f"loss: reduction must be 0 (none), 1 (mean) or 2 (sum), got {reduction!r}")


def _abs_diff(b: Builder, x: Value, target: Value) -> Value:
    return unary(b, "abs", binary(b, "sub", x, target))


@rule("aten::mse_loss")
def mse_loss(b: Builder, x: Value, target: Value, reduction: int = 1) -> Value:
    """mse_loss(Tensor self, Tensor target, int reduction=Mean) -> Tensor"""
    d = binary(b, "sub", x, target)
    return _reduce(b, binary(b, "mul", d, d), reduction)


@rule("aten::l1_loss")
def l1_loss(b: Builder, x: Value, target: Value, reduction: int = 1) -> Value:
    """l1_loss(Tensor self, Tensor target, int reduction=Mean) -> Tensor"""
    return _reduce(b, _abs_diff(b, x, target), reduction)


@rule("aten::smooth_l1_loss")
def smooth_l1_loss(b: Builder, x: Value, target: Value, reduction: int = 1, beta: float = 1.0) -> Value:
    """smooth_l1_loss(Tensor self, Tensor target, int reduction=Mean, float beta=1.0) -> Tensor

    |d| < beta ? 0.5 d² / beta : |d| - beta / 2; beta = 0 is the L1 loss."""
    d = _abs_diff(b, x, target)
    if beta == 0:
        return _reduce(b, d, reduction)
    quad = binary(b, "mul", binary(b, "mul", d, d), 0.5 / beta)
    return _reduce(b, select(b, binary(b, "lt", d, beta), quad, binary(b, "sub", d, 0.5 * beta)), reduction)


@rule("aten::huber_loss")
def huber_loss(b: Builder, x: Value, target: Value, reduction: int = 1, delta: float = 1.0) -> Value:
    """huber_loss(Tensor self, Tensor target, int reduction=Mean, float delta=1.0) -> Tensor

    |d| < delta ? 0.5 d² : delta (|d| - delta / 2)."""
    d = _abs_diff(b, x, target)
    quad = binary(b, "mul", binary(b, "mul", d, d), 0.5)
    lin = binary(b, "mul", binary(b, "sub", d, 0.5 * delta), delta)
    return _reduce(b, select(b, binary(b, "lt", d, delta), quad, lin), reduction)

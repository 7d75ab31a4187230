"""Batch normalization in eval mode, folded at export time into one per-channel scale and shift."""

from __future__ import annotations

import torch

from torchlower.core.values import Value, constant
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder


def _fold(
    b: Builder,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    mean: Value | None,
    var: Value | None,
    eps: float,
) -> Value:
    """y = x * scale + shift with scale = w / sqrt(var + eps), shift = b - mean * scale."""
    for name, v in (("weight", weight), ("bias", bias), ("running_mean", mean), ("running_var", var)):
        if v is not None and not v.is_const:
            raise LoweringError(f"batch_norm: {name} must be a constant (a parameter or buffer)")
    if mean is None or var is None:
        raise LoweringError("batch_norm: eval mode needs running_mean and running_var (got None)")
    with torch.no_grad():
        scale = torch.rsqrt(var.const.double() + eps)
        if weight is not None:
            scale = scale * weight.const.double()
        shift = -mean.const.double() * scale
        if bias is not None:
            shift = shift + bias.const.double()
    dtype = x.dtype or torch.float32
    shape = [1, -1] + [1] * (x.rank - 2)
    y = b.call("mul", [x, constant(scale.to(dtype).reshape(shape))], dtype=x.dtype, shape=x.shape)
    return b.call("add", [y, constant(shift.to(dtype).reshape(shape))], dtype=x.dtype, shape=x.shape)


@rule("aten::batch_norm")
def batch_norm(
    b: Builder,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    running_mean: Value | None,
    running_var: Value | None,
    training: bool,
    momentum: float,
    eps: float,
    cudnn_enabled: bool,
) -> Value:
    """batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean,
    Tensor? running_var, bool training, float momentum, float eps, bool cudnn_enabled) -> Tensor"""
    if training:
        raise LoweringError(
            "batch_norm: training=True (batch statistics) is not supported; expected eval mode"
        )
    return _fold(b, x, weight, bias, running_mean, running_var, eps)


@rule("aten::_native_batch_norm_legit_no_training")
def native_batch_norm_no_training(
    b: Builder,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    running_mean: Value,
    running_var: Value,
    momentum: float,
    eps: float,
) -> tuple[Value, Value, Value]:
    """_native_batch_norm_legit_no_training(Tensor input, Tensor? weight, Tensor? bias,
    Tensor running_mean, Tensor running_var, float momentum, float eps) -> (Tensor, Tensor, Tensor)"""
    empty = constant(torch.empty(0))
    return _fold(b, x, weight, bias, running_mean, running_var, eps), empty, empty


@rule("aten::native_batch_norm")
def native_batch_norm(
    b: Builder,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    running_mean: Value | None,
    running_var: Value | None,
    training: bool,
    momentum: float,
    eps: float,
) -> tuple[Value, Value, Value]:
    """native_batch_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean,
    Tensor? running_var, bool training, float momentum, float eps) -> (Tensor, Tensor, Tensor)"""
    if training:
        raise LoweringError("native_batch_norm: training=True is not supported; expected eval mode")
    empty = constant(torch.empty(0))
    return _fold(b, x, weight, bias, running_mean, running_var, eps), empty, empty

"""Normalizations over feature axes: layer, group, instance and RMS norm.

All are written as plain NNEF reductions (``mean_reduce`` / ``rsqrt``) so they run in tract and
stay Khronos-compatible; ``eps`` is always a literal, never a weight file.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.nn.modules.instancenorm import _InstanceNorm

from torchlower.core.values import Value, constant
from torchlower.errors import LoweringError
from torchlower.rules import module_rule, rule
from torchlower.rules.common import Builder, channel_param, reshape, shape_of


def normalize(b: Builder, x: Value, axes: list[int], eps: float) -> Value:
    """``(x - mean) / sqrt(var + eps)`` over ``axes`` (biased variance, as PyTorch)."""
    shape = shape_of(x)
    reduced = tuple(1 if i in axes else d for i, d in enumerate(shape))
    mean = b.call("mean_reduce", [x], {"axes": axes}, dtype=x.dtype, shape=reduced)
    centred = b.call("sub", [x, mean], dtype=x.dtype, shape=shape)
    square = b.call("sqr", [centred], dtype=x.dtype, shape=shape)
    var = b.call("mean_reduce", [square], {"axes": axes}, dtype=x.dtype, shape=reduced)
    shifted = b.call("add", [var, float(eps)], dtype=x.dtype, shape=reduced)
    inv = b.call("rsqrt", [shifted], dtype=x.dtype, shape=reduced)
    return b.call("mul", [centred, inv], dtype=x.dtype, shape=shape)


def affine(b: Builder, y: Value, weight: Value | None, bias: Value | None, axis: int, trailing: int) -> Value:
    """Scale and shift by parameters covering ``trailing`` dims starting at ``axis``."""
    rank = y.rank
    for param, op in ((weight, "mul"), (bias, "add")):
        if param is None:
            continue
        param = _broadcastable(b, param, rank, axis, trailing)
        y = b.call(op, [y, param], dtype=y.dtype, shape=y.shape)
    return y


def _broadcastable(b: Builder, p: Value, rank: int, axis: int, trailing: int) -> Value:
    if trailing == 1 and p.is_const:
        return channel_param(p, rank, axis)
    shape = [1] * axis + list(shape_of(p)) + [1] * (rank - axis - trailing)
    return reshape(b, p, shape)


@rule("aten::layer_norm")
def layer_norm(
    b: Builder,
    x: Value,
    normalized_shape: Sequence[int],
    weight: Value | None,
    bias: Value | None,
    eps: float,
    cudnn_enable: bool,
) -> Value:
    """layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, Tensor? bias=None,
    float eps=1e-05, bool cudnn_enable=True) -> Tensor"""
    k = len(normalized_shape)
    axes = list(range(x.rank - k, x.rank))
    y = normalize(b, x, axes, eps)
    return affine(b, y, weight, bias, x.rank - k, k)


@rule("aten::native_layer_norm")
def native_layer_norm(
    b: Builder,
    x: Value,
    normalized_shape: Sequence[int],
    weight: Value | None,
    bias: Value | None,
    eps: float,
) -> tuple[Value, Value, Value]:
    """native_layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias,
    float eps) -> (Tensor, Tensor, Tensor)"""
    k = len(normalized_shape)
    axes = list(range(x.rank - k, x.rank))
    y = affine(b, normalize(b, x, axes, eps), weight, bias, x.rank - k, k)
    mean, rstd = _stats(b, x, axes, eps)
    return y, mean, rstd


def _stats(b: Builder, x: Value, axes: list[int], eps: float) -> tuple[Value, Value]:
    """Mean and 1/std, the auxiliary results of ``native_*_norm`` (dead unless used)."""
    reduced = tuple(1 if i in axes else d for i, d in enumerate(shape_of(x)))
    mean = b.call("mean_reduce", [x], {"axes": axes}, dtype=x.dtype, shape=reduced)
    centred = b.call("sub", [x, mean], dtype=x.dtype, shape=x.shape)
    var = b.call("mean_reduce", [b.call("sqr", [centred])], {"axes": axes}, dtype=x.dtype, shape=reduced)
    rstd = b.call("rsqrt", [b.call("add", [var, float(eps)])], dtype=x.dtype, shape=reduced)
    return mean, rstd


def _group_normalize(b: Builder, x: Value, groups: int, eps: float) -> Value:
    """Normalize each of ``groups`` channel groups over its channels and all spatial positions."""
    shape = shape_of(x)
    if shape[1] % groups:
        raise LoweringError(f"group_norm: num_groups={groups} must divide the {shape[1]} channels")
    y = normalize(b, _grouped(b, x, groups), [2], eps)
    return b.call("reshape", [y], {"shape": [0, *shape[1:]]}, dtype=x.dtype, shape=shape)


def _grouped(b: Builder, x: Value, groups: int) -> Value:
    """``(N, C, *S)`` → ``(N, G, C/G·prod(S))``; ``0`` keeps the batch dim symbolic."""
    rest = shape_of(x)[1:]
    size = int(torch.Size(rest).numel()) // groups if all(isinstance(d, int) for d in rest) else -1
    return b.call("reshape", [x], {"shape": [0, groups, -1]}, dtype=x.dtype, shape=(x.shape[0], groups, size))


@rule("aten::group_norm")
def group_norm(
    b: Builder,
    x: Value,
    num_groups: int,
    weight: Value | None,
    bias: Value | None,
    eps: float,
    cudnn_enabled: bool,
) -> Value:
    """group_norm(Tensor input, int num_groups, Tensor? weight=None, Tensor? bias=None,
    float eps=1e-05, bool cudnn_enabled=True) -> Tensor"""
    y = _group_normalize(b, x, num_groups, eps)
    return affine(b, y, weight, bias, 1, 1)


@rule("aten::native_group_norm")
def native_group_norm(
    b: Builder,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    n: int,
    c: int,
    hxw: int,
    group: int,
    eps: float,
) -> tuple[Value, Value, Value]:
    """native_group_norm(Tensor input, Tensor? weight, Tensor? bias, SymInt N, SymInt C,
    SymInt HxW, int group, float eps) -> (Tensor, Tensor, Tensor)"""
    y = affine(b, _group_normalize(b, x, group, eps), weight, bias, 1, 1)
    mean, rstd = _stats(b, _grouped(b, x, group), [2], eps)
    return y, reshape(b, mean, [0, group]), reshape(b, rstd, [0, group])


@rule("aten::instance_norm")
def instance_norm(
    b: Builder,
    x: Value,
    weight: Value | None,
    bias: Value | None,
    running_mean: Value | None,
    running_var: Value | None,
    use_input_stats: bool,
    momentum: float,
    eps: float,
    cudnn_enabled: bool,
) -> Value:
    """instance_norm(Tensor input, Tensor? weight, Tensor? bias, Tensor? running_mean,
    Tensor? running_var, bool use_input_stats, float momentum, float eps, bool cudnn_enabled) -> Tensor"""
    if use_input_stats:
        y = normalize(b, x, list(range(2, x.rank)), eps)
    else:
        y = _running_stats(b, x, running_mean, running_var, eps)
    return affine(b, y, weight, bias, 1, 1)


def _running_stats(b: Builder, x: Value, mean: Value | None, var: Value | None, eps: float) -> Value:
    """Inference with tracked statistics: folded to one scale and shift per channel."""
    if mean is None or var is None or not (mean.is_const and var.is_const):
        raise LoweringError("instance_norm: use_input_stats=False needs constant running_mean/running_var")
    scale = torch.rsqrt(var.const + eps)
    y = b.call("mul", [x, channel_param(constant(scale), x.rank)], dtype=x.dtype, shape=x.shape)
    shift = channel_param(constant(-mean.const * scale), x.rank)
    return b.call("add", [y, shift], dtype=x.dtype, shape=x.shape)


@rule("aten::rms_norm")
def rms_norm(
    b: Builder, x: Value, normalized_shape: Sequence[int], weight: Value | None, eps: float | None
) -> Value:
    """rms_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None) -> Tensor"""
    if eps is None:  # PyTorch's default: machine epsilon of the input dtype
        eps = torch.finfo(x.dtype or torch.float32).eps
    k = len(normalized_shape)
    axes = list(range(x.rank - k, x.rank))
    shape = shape_of(x)
    reduced = tuple(1 if i in axes else d for i, d in enumerate(shape))
    square = b.call("sqr", [x], dtype=x.dtype, shape=shape)
    mean = b.call("mean_reduce", [square], {"axes": axes}, dtype=x.dtype, shape=reduced)
    inv = b.call("rsqrt", [b.call("add", [mean, float(eps)], dtype=x.dtype, shape=reduced)], dtype=x.dtype)
    y = b.call("mul", [x, inv], dtype=x.dtype, shape=shape)
    return affine(b, y, weight, None, x.rank - k, k)


@module_rule(_InstanceNorm)
def instance_norm_module(b: Builder, m: _InstanceNorm, x: Value) -> Value:
    """nn.InstanceNorm1d/2d/3d (their forward branches on the input rank, which FX cannot trace)."""
    unbatched = x.rank == m._get_no_batch_dim()
    if unbatched:
        x = b.call("unsqueeze", [x], {"axes": [0]}, dtype=x.dtype, shape=(1, *shape_of(x)))
    params = [_tensor(getattr(m, n), n) for n in ("weight", "bias", "running_mean", "running_var")]
    use_input_stats = m.training or not m.track_running_stats
    y = instance_norm(b, x, *params, use_input_stats, m.momentum or 0.0, m.eps, False)
    if unbatched:
        y = b.call("squeeze", [y], {"axes": [0]}, dtype=y.dtype, shape=shape_of(y)[1:])
    return y


def _tensor(t: torch.Tensor | None, label: str) -> Value | None:
    return None if t is None else constant(t.detach(), label=label)

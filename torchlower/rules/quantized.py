"""torch.ao eager-mode quantized ops (static quantization) as tract quantized tensors.

Activations are ``u8`` tensors whose scale and zero point live in ``graph.quant`` (the builder
keeps them: ``b.quantize`` / ``b.quant_params``). Weights are stored as ``i8`` codes.

- Per-tensor weights run tract's integer kernels: ``conv`` with a ``u8`` input, an ``i8`` filter
  and an ``i32`` bias quantized at scale ``s_x · s_w``, requantized into the output's
  ``graph.quant`` type (linear is a 1-wide ``conv`` so the bias is added before requantizing,
  as fbgemm does).
- Per-channel weights: ``graph.quant`` holds one scale per tensor, so tract 0.23 cannot read a
  per-channel type. The ``i8`` codes and an f32 scale per output channel are stored, the filter
  is rebuilt as ``(codes − zp) × scale`` (constant-folded by tract at load), the product runs in
  f32 on the dequantized input and is requantized with a cast to the output's ``graph.quant``
  type. ``add`` and ``cat`` go the same way (dequantize, compute, requantize), which is exactly
  what PyTorch's reference kernels specify.

tract may round differently from fbgemm on ties of the requantization: outputs can differ by one
quantization step (see docs/compression.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from torchlower.core.values import Value, constant, normalize_dim
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder, align_ranks, shape_of

# ScalarType codes of quantized dtypes, as traced graphs store them
_QDTYPE_OF_CODE = {12: torch.qint8, 13: torch.quint8, 14: torch.qint32}
_STORAGE = {torch.quint8: "u8", torch.qint8: "i8", torch.qint32: "i32"}


@rule("aten::quantize_per_tensor")
def quantize_per_tensor(b: Builder, x: Value, scale: float, zero_point: int, dtype: Any) -> Value:
    """quantize_per_tensor(Tensor self, float scale, int zero_point, ScalarType dtype) -> Tensor"""
    qdtype = _QDTYPE_OF_CODE.get(dtype, dtype)
    if qdtype not in _STORAGE:
        raise LoweringError(f"quantize_per_tensor: dtype must be quint8, qint8 or qint32, got {dtype!r}")
    return _requantize(b, x, scale, zero_point, qdtype)


@rule("aten::dequantize.self")  # not dequantize.tensors (a list)
def dequantize(b: Builder, x: Value) -> Value:
    """dequantize.self(Tensor self) -> Tensor"""
    q = b.quant_params(x)
    if q is None:
        return x
    b.dequantized_steps.append(q.scale)  # the check's default tolerance (tolerance.quantized)
    return _float(b, x)


@rule("quantized::conv2d")
def conv2d(b: Builder, x: Value, packed: Any, scale: float, zero_point: int) -> Value:
    """quantized::conv2d(Tensor qx, Conv2dPackedParamsBase packed_weight, float output_scale,
    int output_zero_point) -> Tensor"""
    return _conv(b, x, packed, scale, zero_point, relu=False)


@rule("quantized::conv2d_relu")
def conv2d_relu(b: Builder, x: Value, packed: Any, scale: float, zero_point: int) -> Value:
    """quantized::conv2d_relu(Tensor qx, Conv2dPackedParamsBase packed_weight, float output_scale,
    int output_zero_point) -> Tensor"""
    return _conv(b, x, packed, scale, zero_point, relu=True)


@rule("quantized::linear")
def linear(b: Builder, x: Value, packed: Any, scale: float, zero_point: int) -> Value:
    """quantized::linear(Tensor X, LinearPackedParamsBase W_prepack, float Y_scale_i,
    int Y_zero_point_i) -> Tensor Y"""
    return _linear(b, x, packed, scale, zero_point, relu=False)


@rule("quantized::linear_relu")
def linear_relu(b: Builder, x: Value, packed: Any, scale: float, zero_point: int) -> Value:
    """quantized::linear_relu(Tensor X, LinearPackedParamsBase W_prepack, float Y_scale_i,
    int Y_zero_point_i) -> Tensor Y"""
    return _linear(b, x, packed, scale, zero_point, relu=True)


@rule("quantized::add")
def add(b: Builder, qa: Value, qb: Value, scale: float, zero_point: int) -> Value:
    """quantized::add(Tensor qa, Tensor qb, float scale, int zero_point) -> Tensor qc"""
    return _binary(b, "add", qa, qb, scale, zero_point, relu=False)


@rule("quantized::add_relu")
def add_relu(b: Builder, qa: Value, qb: Value, scale: float, zero_point: int) -> Value:
    """quantized::add_relu(Tensor qa, Tensor qb, float scale, int zero_point) -> Tensor qc"""
    return _binary(b, "add", qa, qb, scale, zero_point, relu=True)


@rule("quantized::mul")
def mul(b: Builder, qa: Value, qb: Value, scale: float, zero_point: int) -> Value:
    """quantized::mul(Tensor qa, Tensor qb, float scale, int zero_point) -> Tensor qc"""
    return _binary(b, "mul", qa, qb, scale, zero_point, relu=False)


@rule("quantized::cat")
def cat(b: Builder, qx: Sequence[Value], dim: int, scale: float | None, zero_point: int | None) -> Value:
    """quantized::cat(Tensor[] qx, int dim, float? scale, int? zero_point) -> Tensor"""
    first = _params(b, qx[0], "cat")
    scale = first.scale if scale is None else scale
    zero_point = first.zero_point if zero_point is None else zero_point
    axis = normalize_dim(dim, qx[0].rank)
    parts = [_float(b, _quantized(b, q, "cat")) for q in qx]
    y = b.call("concat", [parts], {"axis": axis}, dtype=torch.float32)
    return _requantize(b, y, scale, zero_point, torch.quint8)


# ---- helpers ----------------------------------------------------------------------------------
def _conv(b: Builder, x: Value, packed: Any, scale: float, zero_point: int, relu: bool) -> Value:
    if packed.transpose():
        raise LoweringError("quantized conv_transpose is not supported (packed_weight.transpose() is true)")
    w, bias = packed.unpack()
    n = w.dim() - 2
    attrs = {
        "border": "constant",
        "padding": [(int(p), int(p)) for p in packed.padding()],
        "stride": [int(s) for s in packed.stride()],
        "dilation": [int(d) for d in packed.dilation()],
        "groups": int(packed.groups()),
    }
    if len(attrs["padding"]) != n:
        raise LoweringError(f"quantized conv: {len(attrs['padding'])} paddings for a {n}-d kernel")
    return _product(b, x, w, bias, attrs, scale, zero_point, relu)


def _linear(b: Builder, x: Value, packed: Any, scale: float, zero_point: int, relu: bool) -> Value:
    """A 1-wide conv on ``[N, I, 1]``: tract's quantized conv adds the i32 bias before requantizing."""
    w, bias = torch.ops.quantized.linear_unpack(packed)
    lead, features = list(shape_of(x)[:-1]), shape_of(x)[-1]
    rows = math.prod(int(d) for d in lead)
    x3 = b.call("reshape", [x], {"shape": [rows, features, 1]}, dtype=x.dtype, shape=(rows, features, 1))
    attrs = {"border": "constant", "padding": [(0, 0)], "stride": [1], "dilation": [1], "groups": 1}
    y = _product(b, x3, w.unsqueeze(-1), bias, attrs, scale, zero_point, relu)
    out = (*lead, w.shape[0])
    return b.call("reshape", [y], {"shape": list(out)}, dtype=y.dtype, shape=out)


def _product(
    b: Builder,
    x: Value,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    attrs: dict[str, Any],
    scale: float,
    zero_point: int,
    relu: bool,
) -> Value:
    """``conv(x, w) + bias`` requantized to (scale, zero_point), in integers when tract can."""
    qx = _params(b, x, "conv/linear")
    out_channels = w.shape[0]
    codes = constant(w.int_repr(), label=f"{b.hint}/weight")
    if w.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        filt = b.quantize(b.tensor(codes), w.q_scale(), w.q_zero_point(), torch.qint8)
        acc_scale = qx.scale * w.q_scale()
        b_codes = torch.zeros(out_channels, dtype=torch.int32) if bias is None else bias / acc_scale
        b_codes = torch.round(b_codes.double()).to(torch.int32).reshape(1, -1)
        qbias = b.quantize(b.tensor(constant(b_codes, label=f"{b.hint}/bias")), acc_scale, 0, torch.qint32)
        y = b.call("conv", [x, filt, qbias], attrs, dtype=torch.quint8)
        y = b.quantize(y, scale, zero_point, torch.quint8)
        return (
            b.quantize(b.call("relu", [y], dtype=torch.quint8), scale, zero_point, torch.quint8)
            if relu
            else y
        )
    if w.qscheme() not in (torch.per_channel_affine, torch.per_channel_symmetric) or w.q_per_channel_axis():
        raise LoweringError(f"quantized weight: qscheme {w.qscheme()} on axis 0 or per tensor expected")
    bcast = (-1,) + (1,) * (w.dim() - 1)
    filt = b.call(
        "tract_core_cast", [b.tensor(codes)], {"to": b.dtype_name(torch.float32)}, dtype=torch.float32
    )
    zps = w.q_per_channel_zero_points()
    if bool((zps != 0).any()):
        filt = b.call(
            "sub", [filt, constant(zps.float().reshape(bcast), label=f"{b.hint}/weight_zero_point")]
        )
    scales = constant(w.q_per_channel_scales().float().reshape(bcast), label=f"{b.hint}/weight_scale")
    filt = b.call("mul", [filt, scales], dtype=torch.float32)
    fbias: Value | float = (
        0.0 if bias is None else constant(bias.detach().float().reshape(1, -1), label=f"{b.hint}/bias")
    )
    y = b.call("conv", [_float(b, x), filt, fbias], attrs, dtype=torch.float32)
    if relu:
        y = b.call("relu", [y], dtype=torch.float32)
    return _requantize(b, y, scale, zero_point, torch.quint8)


def _binary(b: Builder, op: str, qa: Value, qb: Value, scale: float, zero_point: int, relu: bool) -> Value:
    fa, fb = (_float(b, _quantized(b, q, op)) for q in (qa, qb))
    fa, fb = align_ranks(b, fa, fb)
    y = b.call(op, [fa, fb], dtype=torch.float32)
    if relu:
        y = b.call("relu", [y], dtype=torch.float32)
    return _requantize(b, y, scale, zero_point, torch.quint8)


def _requantize(b: Builder, x: Value, scale: float, zero_point: int, dtype: torch.dtype) -> Value:
    """``x`` (float or quantized) cast into the quantized type (scale, zero_point)."""
    y = b.call("tract_core_cast", [x], {"to": _STORAGE[dtype]}, dtype=dtype, shape=x.shape)
    return b.quantize(y, scale, zero_point, dtype)


def _float(b: Builder, x: Value) -> Value:
    return b.call(
        "tract_core_cast", [x], {"to": b.dtype_name(torch.float32)}, dtype=torch.float32, shape=x.shape
    )


def _quantized(b: Builder, x: Value, op: str) -> Value:
    _params(b, x, op)
    return x


def _params(b: Builder, x: Value, op: str) -> Any:
    params = b.quant_params(x)
    if params is None:
        raise LoweringError(
            f"quantized {op}: input {x.name} is not a quantized tensor (no quantize_per_tensor before it)"
        )
    return params

"""Pointwise activations and softmax.

Fused tract ops where tract has them (silu, hard_swish, gelu_approx, softmax, log_softmax);
otherwise a few NNEF primitives with every torch parameter honoured (elu alpha, softplus beta
and threshold, hardtanh bounds).
"""

from __future__ import annotations

import math

import torch

from torchlower.core.values import Value, normalize_dim
from torchlower.errors import LoweringError
from torchlower.rules import nan, rule
from torchlower.rules.common import Builder, Scalar, cast
from torchlower.rules.math import log1p


def _unary(b: Builder, op: str, x: Value, attrs: dict | None = None) -> Value:
    return b.call(op, [x], attrs, dtype=x.dtype, shape=x.shape)


def _bin(b: Builder, op: str, x: Value, y: Value | float) -> Value:
    return b.call(op, [x, y], dtype=x.dtype, shape=x.shape)


@rule("aten::relu", "aten::relu_")
def relu(b: Builder, x: Value) -> Value:
    """relu(Tensor self) -> Tensor  (float: NaN and -0.0 kept, ``rules/nan.py``)"""
    return nan.relu(b, x) if nan.is_float(x) else _unary(b, "relu", x)


@rule("aten::hardtanh", "aten::hardtanh_")
def hardtanh(b: Builder, x: Value, min_val: Scalar = -1.0, max_val: Scalar = 1.0) -> Value:
    """hardtanh(Tensor self, Scalar min_val=-1, Scalar max_val=1) -> Tensor  (ReLU6 traces as this;
    NaN kept, ``rules/nan.py``)"""
    if nan.is_float(x):
        return nan.bounded(b, x, float(min_val), float(max_val))
    return _bin(b, "min", _bin(b, "max", x, float(min_val)), float(max_val))


@rule("aten::relu6", "aten::relu6_")
def relu6(b: Builder, x: Value) -> Value:
    """relu6(Tensor self) -> Tensor"""
    return hardtanh(b, x, 0.0, 6.0)


@rule("aten::leaky_relu", "aten::leaky_relu_")
def leaky_relu(b: Builder, x: Value, negative_slope: Scalar = 0.01) -> Value:
    """leaky_relu(Tensor self, Scalar negative_slope=0.01) -> Tensor"""
    return _unary(b, "leaky_relu", x, {"alpha": float(negative_slope)})


@rule("aten::elu", "aten::elu_")
def elu(b: Builder, x: Value, alpha: Scalar = 1.0, scale: Scalar = 1.0, input_scale: Scalar = 1.0) -> Value:
    """elu(Tensor self, Scalar alpha=1, Scalar scale=1, Scalar input_scale=1) -> Tensor

    scale * (x if x > 0 else alpha * (exp(x * input_scale) - 1)); exp overflow on the positive
    side is discarded by the select.
    """
    xs = _bin(b, "mul", x, float(input_scale)) if input_scale != 1 else x
    neg = _bin(b, "sub", _unary(b, "exp", xs), 1.0)
    if alpha != 1:
        neg = _bin(b, "mul", neg, float(alpha))
    positive = b.call("gt", [x, 0.0], dtype=torch.bool, shape=x.shape)
    y = b.call("select", [positive, x, neg], dtype=x.dtype, shape=x.shape)
    return _bin(b, "mul", y, float(scale)) if scale != 1 else y


_GELU_TAIL = -10.0  # torch's tanh-gelu is exactly -0.0 from about -5.06 down


@rule("aten::gelu", "aten::gelu_")
def gelu(b: Builder, x: Value, approximate: str = "none") -> Value:
    """gelu(Tensor self, *, str approximate='none') -> Tensor"""
    if approximate == "tanh":
        # tract's fused kernel drifts in the saturated negative tail (-2980 at x = -1e10, where
        # torch's 1 + tanh(..) is exactly 0 and the result -0.0): below -10 the result is x · 0
        fused = _unary(b, "tract_core_gelu_approx", x, {"fast_impl": False})
        tail = b.call("lt", [x, _GELU_TAIL], dtype=torch.bool, shape=x.shape)
        signed_zero = _bin(b, "mul", x, _bin(b, "sub", x, x))  # x - x is not folded: NaN for inf
        return b.call("select", [tail, signed_zero, fused], dtype=x.dtype, shape=x.shape)
    if approximate != "none":
        raise LoweringError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    erf = _unary(b, "tract_core_erf", _bin(b, "mul", x, 1.0 / math.sqrt(2.0)))
    return _bin(b, "mul", _bin(b, "mul", x, 0.5), _bin(b, "add", erf, 1.0))


@rule("aten::silu", "aten::silu_")
def silu(b: Builder, x: Value) -> Value:
    """silu(Tensor self) -> Tensor"""
    return _unary(b, "tract_core_silu", x)


@rule("aten::sigmoid", "aten::sigmoid_")
def sigmoid(b: Builder, x: Value) -> Value:
    """sigmoid(Tensor self) -> Tensor"""
    return _unary(b, "sigmoid", x)


@rule("aten::tanh", "aten::tanh_")
def tanh(b: Builder, x: Value) -> Value:
    """tanh(Tensor self) -> Tensor"""
    return _unary(b, "tanh", x)


@rule("aten::hardswish", "aten::hardswish_")
def hardswish(b: Builder, x: Value) -> Value:
    """hardswish(Tensor self) -> Tensor"""
    return _unary(b, "tract_core_hard_swish", x)


@rule("aten::hardsigmoid", "aten::hardsigmoid_")
def hardsigmoid(b: Builder, x: Value) -> Value:
    """hardsigmoid(Tensor self) -> Tensor: clamp(x / 6 + 1/2, 0, 1)"""
    return hardtanh(b, _bin(b, "add", _bin(b, "mul", x, 1.0 / 6.0), 0.5), 0.0, 1.0)


@rule("aten::softplus")
def softplus(b: Builder, x: Value, beta: Scalar = 1.0, threshold: Scalar = 20.0) -> Value:
    """softplus(Tensor self, Scalar beta=1, Scalar threshold=20) -> Tensor

    log1p(exp(beta x)) / beta, and x itself where beta x > threshold (as torch does). Not NNEF's
    softplus: its log(exp(x) + 1) rounds to 0 below x ≈ -17, and log(softplus(-30)) became -inf.
    """
    bx = _bin(b, "mul", x, float(beta)) if beta != 1 else x
    soft = log1p(b, _unary(b, "exp", bx))
    if beta != 1:
        soft = _bin(b, "div", soft, float(beta))
    linear = b.call("gt", [bx, float(threshold)], dtype=torch.bool, shape=x.shape)
    return b.call("select", [linear, x, soft], dtype=x.dtype, shape=x.shape)


@rule("aten::softmax.int", "aten::_softmax")  # not softmax.Dimname: its dim is a name
def softmax(b: Builder, x: Value, dim: int, dtype: torch.dtype | bool | None = None) -> Value:
    """softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor  (also _softmax)"""
    return _softmax(b, "softmax", x, dim, dtype)


@rule("aten::log_softmax.int", "aten::_log_softmax")
def log_softmax(b: Builder, x: Value, dim: int, dtype: torch.dtype | bool | None = None) -> Value:
    """log_softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor  (also _log_softmax)"""
    return _softmax(b, "tract_core_log_softmax", x, dim, dtype)


def _softmax(b: Builder, op: str, x: Value, dim: int, dtype: torch.dtype | bool | None) -> Value:
    # _softmax's third argument is half_to_float (a bool), softmax.int's is an optional dtype
    if isinstance(dtype, torch.dtype):
        x = cast(b, x, dtype)
    x = b.accurate(x)  # f32 inside an f16 export: exp and the sum lose too much in f16
    if x.rank == 0:  # a scalar is its own (only) class
        x1 = b.call("unsqueeze", [x], {"axes": [0]}, dtype=x.dtype, shape=(1,))
        y = b.call("squeeze", [_unary(b, op, x1, {"axes": [0]})], {"axes": [0]}, dtype=x.dtype, shape=())
        return b.compute(y)
    return b.compute(_unary(b, op, x, {"axes": [normalize_dim(dim, x.rank)]}))

"""Lattice rules for torch functions on features: ``torch.relu(x)``, ``F.gelu(x)``, ``x * 2.0``,
``F.layer_norm(x, …)``, ``torch.exp(x)``… on a sparse tensor (or a dense feature tensor).

The FX front end resolves these calls to ATen names, so the rules are keyed by those names and
receive ATen schema arguments. Each lowers like its module form: ``decompose → op →
with_features`` on a sparse value, the bare op on a dense one.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import torch

from torchlower.core.values import Value
from torchlower.errors import LoweringError
from torchlower.lattice.builder import LatticeBuilder, f32
from torchlower.lattice.rule_base import LATTICE_RULES, activation_attrs, constant, feature_op, symbolic

rule = LATTICE_RULES.function


def _feature(b: LatticeBuilder, x: object, op: str, attrs: list[tuple[str, str]]) -> Value:
    return feature_op(b, x, op, attrs, b.result_name())


@rule("aten::relu")
def relu(b: LatticeBuilder, x: Value) -> Value:
    """relu(Tensor self) -> Tensor"""
    return _feature(b, x, "activation", activation_attrs("relu"))


@rule("aten::silu")
def silu(b: LatticeBuilder, x: Value) -> Value:
    """silu(Tensor self) -> Tensor"""
    return _feature(b, x, "activation", activation_attrs("silu"))


@rule("aten::sigmoid")
def sigmoid(b: LatticeBuilder, x: Value) -> Value:
    """sigmoid(Tensor self) -> Tensor"""
    return _feature(b, x, "activation", activation_attrs("sigmoid"))


@rule("aten::tanh")
def tanh(b: LatticeBuilder, x: Value) -> Value:
    """tanh(Tensor self) -> Tensor"""
    return _feature(b, x, "activation", activation_attrs("tanh"))


@rule("aten::gelu")
def gelu(b: LatticeBuilder, x: Value, approximate: str) -> Value:
    """gelu(Tensor self, *, str approximate='none') -> Tensor"""
    attrs = activation_attrs("gelu", approximate=str(constant(approximate, "approximate")))
    return _feature(b, x, "activation", attrs)


@rule("aten::leaky_relu")
def leaky_relu(b: LatticeBuilder, x: Value, negative_slope: float) -> Value:
    """leaky_relu(Tensor self, Scalar negative_slope=0.01) -> Tensor"""
    attrs = activation_attrs("leaky_relu", alpha=float(constant(negative_slope, "negative_slope")))  # type: ignore[arg-type]
    return _feature(b, x, "activation", attrs)


@rule("aten::softplus")
def softplus(b: LatticeBuilder, x: Value, beta: float, threshold: float) -> Value:
    """softplus(Tensor self, Scalar beta=1, Scalar threshold=20) -> Tensor"""
    attrs = activation_attrs(
        "softplus",
        beta=float(constant(beta, "beta")),  # type: ignore[arg-type]
        threshold=float(constant(threshold, "threshold")),  # type: ignore[arg-type]
    )
    return _feature(b, x, "activation", attrs)


ELEMENTWISE = ("exp", "round")  # the kinds the consumer accepts


@rule("aten::exp")
def exp(b: LatticeBuilder, x: Value) -> Value:
    """exp(Tensor self) -> Tensor"""
    return _feature(b, x, "elementwise", [("kind", '"exp"')])


@rule("aten::round")
def round_(b: LatticeBuilder, x: Value) -> Value:
    """round(Tensor self) -> Tensor (half to even, like torch)"""
    return _feature(b, x, "elementwise", [("kind", '"round"')])


@rule("aten::softmax")
def softmax(b: LatticeBuilder, x: Value, dim: int, dtype: object) -> Value:
    """softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor (over channels only)"""
    if constant(dim, "dim") not in (-1, 1) or dtype is not None:
        raise LoweringError(
            f"lattice softmax runs over the channel axis (dim=-1 or 1, no dtype); got dim={dim}"
        )
    return _feature(b, x, "softmax", [("axis", "1")])


# ---- x * c, x + c, x - c, x / c: a channel affine (batch_norm with mean 0, var 1, eps 0) --------
def scalar_affine(b: LatticeBuilder, x: object, scale: float, shift: float) -> Value:
    """``x · scale + shift`` as ``batch_norm`` (``(x − 0) / sqrt(1 + 0) · scale + shift`` is exact),
    parameters stored under the node's name."""
    x = symbolic(x, "scalar arithmetic input")
    node = b.result_name()

    def emit(feats: Value, name: str) -> Value:
        c = int(feats.shape[-1])  # type: ignore[index]
        params = [
            b.weight(f"{node}.weight", torch.full((c,), float(scale)), "channel", "channel_c"),
            b.weight(f"{node}.bias", torch.full((c,), float(shift)), "bias", "bias_c"),
            b.weight(f"{node}.running_mean", torch.zeros(c), "channel", "channel_c"),
            b.weight(f"{node}.running_var", torch.ones(c), "channel", "channel_c"),
        ]
        out = b.dense(name, feats, c)
        return b.op(out.name, "batch_norm", [feats, *params], [("eps", f32(0.0))], out)

    return b.on_features(x, node, emit)


def scalar_operator(b: LatticeBuilder, op: str, lhs: object, rhs: object) -> Value:
    """``x ⊙ c`` or ``c ⊙ x`` for ``⊙`` in ``+ − ·`` (a number and a sparse or feature tensor)."""
    if isinstance(lhs, Value):
        c = _number(rhs, f"{op} operand")
        scale, shift = {"mul": (c, 0.0), "add": (1.0, c), "sub": (1.0, -c)}[op]
        return scalar_affine(b, lhs, scale, shift)
    c = _number(lhs, f"{op} operand")
    scale, shift = {"mul": (c, 0.0), "add": (1.0, c), "sub": (-1.0, c)}[op]
    return scalar_affine(b, rhs, scale, shift)


def _number(v: object, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise LoweringError(f"{what} must be a Python number known at export time, got {type(v).__name__}")
    return float(v)


@rule("aten::mul")
def mul(b: LatticeBuilder, x: Value, other: object) -> Value:
    """mul.Scalar(Tensor self, Scalar other) -> Tensor"""
    return scalar_affine(b, x, _number(other, "mul factor"), 0.0)


@rule("aten::div")
def div(b: LatticeBuilder, x: Value, other: object) -> Value:
    """div.Scalar(Tensor self, Scalar other) -> Tensor"""
    return scalar_affine(b, x, 1.0 / _number(other, "divisor"), 0.0)


@rule("aten::add")
def add(b: LatticeBuilder, x: Value, other: object, alpha: object = 1) -> Value:
    """add.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor"""
    return scalar_affine(b, x, 1.0, _number(other, "addend") * _number(alpha, "alpha"))


@rule("aten::sub")
def sub(b: LatticeBuilder, x: Value, other: object, alpha: object = 1) -> Value:
    """sub.Scalar(Tensor self, Scalar other, Scalar alpha=1) -> Tensor"""
    return scalar_affine(b, x, 1.0, -_number(other, "subtrahend") * _number(alpha, "alpha"))


@rule("aten::neg")
def neg(b: LatticeBuilder, x: Value) -> Value:
    """neg(Tensor self) -> Tensor"""
    return scalar_affine(b, x, -1.0, 0.0)


@rule(operator.truediv)
def truediv(b: LatticeBuilder, x: Value, other: object) -> Value:
    """operator.truediv(x, c) on features"""
    return scalar_affine(b, x, 1.0 / _number(other, "divisor"), 0.0)


@rule(operator.neg)
def negate(b: LatticeBuilder, x: Value) -> Value:
    """operator.neg(x) on features"""
    return scalar_affine(b, x, -1.0, 0.0)


# ---- functional norms ---------------------------------------------------------------------------
def _param(
    b: LatticeBuilder, v: object, default: torch.Tensor, node: str, attr: str, kind: str, layout: str
) -> Value:
    """A norm parameter given to the function: a model constant (stored under its path) or None."""
    if v is None:
        return b.weight(f"{node}.{attr}", default, kind, layout)
    if not isinstance(v, Value) or not v.is_const:
        raise LoweringError(f"{node}: the {attr} of a functional norm must be a model parameter or None")
    return b.weight(v.label or f"{node}.{attr}", v.const, kind, layout)  # type: ignore[arg-type]


def _channels(shape: object, x: Value, what: str) -> int:
    dims = list(constant(shape, "normalized_shape"))  # type: ignore[call-overload]
    if len(dims) != 1 or int(dims[0]) != int(x.shape[-1]):  # type: ignore[index]
        raise LoweringError(f"{what} normalizes over the channels only; normalized_shape {dims}")
    return int(dims[0])


@rule("aten::layer_norm")
def layer_norm(
    b: LatticeBuilder, x: Value, shape: Sequence[int], weight: object, bias: object, eps: float, cudnn: bool
) -> Value:
    """layer_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight, Tensor? bias, float eps,
    bool cudnn_enable) -> Tensor"""
    x = symbolic(x, "layer_norm input")
    c, node = _channels(shape, x, "layer_norm"), b.result_name()

    def emit(feats: Value, name: str) -> Value:
        params = [
            _param(b, weight, torch.ones(c), node, "weight", "channel", "channel_c"),
            _param(b, bias, torch.zeros(c), node, "bias", "bias", "bias_c"),
        ]
        out = b.dense(name, feats, c)
        return b.op(out.name, "layer_norm", [feats, *params], [("eps", f32(float(eps)))], out)

    return b.on_features(x, node, emit)


@rule("aten::rms_norm")
def rms_norm(b: LatticeBuilder, x: Value, shape: Sequence[int], weight: object, eps: float | None) -> Value:
    """rms_norm(Tensor input, SymInt[] normalized_shape, Tensor? weight=None, float? eps=None)"""
    x = symbolic(x, "rms_norm input")
    c, node = _channels(shape, x, "rms_norm"), b.result_name()
    return emit_rms_norm(
        b, x, c, eps, lambda: _param(b, weight, torch.ones(c), node, "weight", "channel", "channel_c")
    )


def emit_rms_norm(b: LatticeBuilder, x: Value, c: int, eps: float | None, scale: object) -> Value:
    """``eps=None`` is the feature dtype's machine epsilon, as torch defines it."""
    value = float(eps) if eps is not None else float(torch.finfo(x.dtype or torch.float32).eps)

    def emit(feats: Value, name: str) -> Value:
        out = b.dense(name, feats, c)
        return b.op(out.name, "rms_norm", [feats, scale()], [("eps", f32(value))], out)  # type: ignore[operator]

    return b.on_features(x, b.result_name(), emit)

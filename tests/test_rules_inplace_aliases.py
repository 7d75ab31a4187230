"""In-place variants and aliases of elementwise rules, each run in tract and compared with PyTorch.

The in-place and alias names mostly reach the rules only through ``torch.jit.trace`` (FX and
``torch.export`` rewrite them to the out-of-place op); every case still runs through every
front end. In-place ops act on a clone so no front end sees a mutated input.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from operator import methodcaller

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import Fn, export_and_check


def _any(shape=(2, 3, 5)) -> torch.Tensor:
    return torch.randn(*shape) * 3


def _pos(shape=(2, 3, 5)) -> torch.Tensor:
    return torch.rand(*shape) * 4 + 0.05


def _unit(shape=(2, 3, 5)) -> torch.Tensor:
    return torch.rand(*shape) * 1.8 - 0.9


def _above1(shape=(2, 3, 5)) -> torch.Tensor:
    return torch.rand(*shape) * 4 + 1.05


def _int(shape=(4, 6)) -> torch.Tensor:
    return torch.randint(-9, 10, shape)


def _nonzero_int(shape=(4, 6)) -> torch.Tensor:
    x = torch.randint(1, 8, shape)
    return x * (torch.randint(0, 2, shape) * 2 - 1)


def _ties() -> torch.Tensor:
    return torch.tensor([[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49, -3.7]])


def _small_ints() -> torch.Tensor:
    """Floats with many exact ties so comparisons hit both outcomes."""
    return torch.randint(-3, 4, (3, 8)).float()


def _nans() -> torch.Tensor:
    return torch.tensor(
        [[math.nan, 1.0, math.nan, -2.0, math.inf, -math.inf], [0.5, -0.5, 3.0, -math.inf, 2.0, 1.0]]
    )


def _nans_t() -> torch.Tensor:
    return torch.tensor(
        [[0.5, math.nan, math.nan, 3.0, -math.inf, 1.0], [math.nan, 2.0, -3.0, 4.0, 5.0, -6.0]]
    )


# name → (fn(*inputs), input factories)
UNARY_INPLACE = {
    "abs_": (methodcaller("abs_"), _any),
    "acos_": (methodcaller("acos_"), _unit),
    "acosh_": (methodcaller("acosh_"), _above1),
    "asin_": (methodcaller("asin_"), _unit),
    "asinh_": (methodcaller("asinh_"), _any),
    "atan_": (methodcaller("atan_"), _any),
    "atanh_": (methodcaller("atanh_"), _unit),
    "ceil_": (methodcaller("ceil_"), _any),
    "cos_": (methodcaller("cos_"), _any),
    "cosh_": (methodcaller("cosh_"), _unit),
    "erf_": (methodcaller("erf_"), _any),
    "exp_": (methodcaller("exp_"), _any),
    "expm1_": (methodcaller("expm1_"), _unit),
    "floor_": (methodcaller("floor_"), _any),
    "log1p_": (methodcaller("log1p_"), _pos),
    "log_": (methodcaller("log_"), _pos),
    "neg_": (methodcaller("neg_"), _any),
    "reciprocal_": (methodcaller("reciprocal_"), _pos),
    "round_": (methodcaller("round_"), _ties),
    "rsqrt_": (methodcaller("rsqrt_"), _pos),
    "sigmoid_": (methodcaller("sigmoid_"), _any),
    "sign_": (methodcaller("sign_"), _small_ints),
    "sin_": (methodcaller("sin_"), _any),
    "sinh_": (methodcaller("sinh_"), _unit),
    "sqrt_": (methodcaller("sqrt_"), _pos),
    "tan_": (methodcaller("tan_"), _unit),
    "tanh_": (methodcaller("tanh_"), _any),
    "trunc_": (methodcaller("trunc_"), _any),
    "elu_": (lambda x: F.elu(x, alpha=0.7, inplace=True), _any),
    "gelu_": (lambda x: torch.ops.aten.gelu_(x, approximate="tanh"), _any),
    "hardsigmoid_": (lambda x: F.hardsigmoid(x, inplace=True), _any),
    "hardswish_": (lambda x: F.hardswish(x, inplace=True), _any),
    "hardtanh_": (lambda x: F.hardtanh(x, -0.5, 2.0, inplace=True), _any),
    "leaky_relu_": (lambda x: F.leaky_relu(x, 0.2, inplace=True), _any),
    "relu6_": (lambda x: torch.ops.aten.relu6_(x), _any),
    "silu_": (lambda x: F.silu(x, inplace=True), _any),
    "clamp_min_": (lambda x: x.clamp_min_(0), _any),
    "clamp_max_": (lambda x: x.clamp_max_(0.5), _any),
    "clip_": (lambda x: torch.ops.aten.clip_(x, -1.0, 0.0), _any),
    "cumsum_": (lambda x: x.cumsum_(1), _any),
    "cumprod_": (lambda x: x.cumprod_(-1), _unit),
    "bitwise_not_": (methodcaller("bitwise_not_"), _int),
    "logical_not_": (methodcaller("logical_not_"), _small_ints),
}

BINARY_INPLACE = {
    "add_.Scalar": (lambda x: torch.ops.aten.add_.Scalar(x, 2.5, 2), (_any,)),
    "add_.Scalar_alpha": (lambda x: x.add_(2, alpha=3), (_int,)),
    "sub_.Tensor": (lambda x, y: x.sub_(y, alpha=0.5), (_any, _any)),
    "sub_.Scalar": (lambda x: torch.ops.aten.sub_.Scalar(x, 1.5), (_any,)),
    "mul_.Tensor": (lambda x, y: x.mul_(y), (_any, _any)),
    "mul_.Scalar": (lambda x: torch.ops.aten.mul_.Scalar(x, -1.5), (_any,)),
    "div_.Tensor": (lambda x, y: x.div_(y), (_any, _pos)),
    "div_.Scalar": (lambda x: torch.ops.aten.div_.Scalar(x, 4.0), (_any,)),
    "div_.Tensor_mode_floor": (lambda x, y: x.div_(y, rounding_mode="floor"), (_any, _pos)),
    "div_.Tensor_mode_trunc": (lambda x, y: x.div_(y, rounding_mode="trunc"), (_int, _nonzero_int)),
    "div_.Scalar_mode": (lambda x: torch.ops.aten.div_.Scalar_mode(x, -3, rounding_mode="floor"), (_int,)),
    "pow_": (lambda x, y: x.pow_(y), (_pos, _unit)),
    "pow_.Scalar": (lambda x: x.pow_(3), (_any,)),
    "atan2_": (lambda x, y: x.atan2_(y), (_any, _any)),
    "fmod_": (lambda x, y: x.fmod_(y), (_int, _nonzero_int)),
    "remainder_": (lambda x: x.remainder_(-1.5), (_any,)),
    "floor_divide_": (lambda x, y: x.floor_divide_(y), (_int, _nonzero_int)),
    "masked_fill_.Tensor": (
        lambda x, y, v: x.masked_fill_(y > 0, v),
        (_any, _any, lambda: torch.tensor(-2.0)),
    ),
    "eq_": (lambda x, y: x.eq_(y), (_small_ints, _small_ints)),
    "ne_": (lambda x, y: x.ne_(y), (_small_ints, _small_ints)),
    "lt_": (lambda x, y: x.lt_(y), (_small_ints, _small_ints)),
    "le_": (lambda x: x.le_(0.0), (_small_ints,)),
    "gt_": (lambda x, y: x.gt_(y), (_small_ints, _small_ints)),
    "ge_": (lambda x, y: x.ge_(y), (_small_ints, _small_ints)),
    "logical_and_": (lambda x, y: x.logical_and_(y), (_small_ints, _small_ints)),
    "logical_or_": (lambda x, y: x.logical_or_(y), (_small_ints, _small_ints)),
    "logical_xor_": (lambda x, y: x.logical_xor_(y), (_small_ints, _small_ints)),
    "bitwise_and_": (lambda x, y: x.bitwise_and_(y), (_int, _int)),
    "bitwise_or_": (lambda x, y: x.bitwise_or_(y), (_int, _int)),
    "bitwise_xor_": (lambda x, y: x.bitwise_xor_(y), (_int, _int)),
    "__iand__": (lambda x, y: x.__iand__(y), (_int, _int)),
    "__ior__": (lambda x, y: x.__ior__(y), (_int, _int)),
    "__ixor__": (lambda x, y: x.__ixor__(y), (_int, _int)),
}

ALIASES = {
    "absolute": (torch.absolute, (_any,)),
    "negative": (torch.negative, (_any,)),
    "arccos": (torch.arccos, (_unit,)),
    "arcsin": (torch.arcsin, (_unit,)),
    "arctan": (torch.arctan, (_any,)),
    "arccosh": (torch.arccosh, (_above1,)),
    "arcsinh": (torch.arcsinh, (_any,)),
    "arctanh": (torch.arctanh, (_unit,)),
    "arctan2": (torch.arctan2, (_any, _any)),
    "_softmax": (lambda x: torch.ops.aten._softmax(x, 1, False), (_any,)),
    "_log_softmax": (lambda x: torch.ops.aten._log_softmax(x, -1, False), (_any,)),
    "fix": (torch.fix, (_any,)),
    "sgn": (torch.sgn, (_small_ints,)),
    "greater": (torch.greater, (_small_ints, _small_ints)),
    "greater_equal": (torch.greater_equal, (_small_ints, _small_ints)),
    "less": (torch.less, (_small_ints, _small_ints)),
    "less_equal": (torch.less_equal, (_small_ints, _small_ints)),
    "not_equal": (torch.not_equal, (_small_ints, _small_ints)),
    "fmax_nan": (torch.fmax, (_nans, _nans_t)),
    "fmin_nan": (torch.fmin, (_nans, _nans_t)),
    "maximum_nan": (torch.maximum, (_nans, _nans_t)),
    "minimum_nan": (torch.minimum, (_nans, _nans_t)),
    "fmax": (torch.fmax, (_any, _any)),
    "fmin": (torch.fmin, (_any, _any)),
    "float_power": (torch.float_power, (_pos, _unit)),
    "float_power_scalar": (lambda x: torch.float_power(x, 2), (_any,)),
    "sub.Scalar": (lambda x: torch.ops.aten.sub.Scalar(x, 1.5, 2), (_any,)),
    "div.Scalar_mode": (lambda x: torch.ops.aten.div.Scalar_mode(x, 2.5, rounding_mode="trunc"), (_any,)),
}


def _inplace(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Apply ``fn`` to a fresh tensor (a clone of the first input), never to the input itself."""
    return lambda x, *rest: fn(x.clone(), *rest)


CASES = {
    **{k: (_inplace(fn), (make,)) for k, (fn, make) in UNARY_INPLACE.items()},
    **{k: (_inplace(fn), makes) for k, (fn, makes) in BINARY_INPLACE.items()},
    **ALIASES,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_inplace_and_alias(tmp_path, frontend, name):
    fn, makes = CASES[name]
    inputs = [make() for make in makes]
    export_and_check(Fn(fn), inputs, tmp_path, frontend)

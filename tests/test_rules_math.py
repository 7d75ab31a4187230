"""Pointwise math rules: each case exports, runs in tract and is compared with PyTorch."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import Fn, export_and_check


def _any(shape=(2, 3, 5)) -> torch.Tensor:
    return torch.randn(*shape) * 3


def _pos(shape=(2, 3, 5)) -> torch.Tensor:
    return torch.rand(*shape) * 4 + 0.05


def _unit(shape=(2, 3, 5)) -> torch.Tensor:
    return torch.rand(*shape) * 1.8 - 0.9


def _int(shape=(4, 6)) -> torch.Tensor:
    return torch.randint(-9, 10, shape)


UNARY = {
    "sqrt": (torch.sqrt, _pos),
    "rsqrt": (torch.rsqrt, _pos),
    "exp": (torch.exp, _any),
    "log": (torch.log, _pos),
    "log1p": (torch.log1p, _pos),
    "expm1": (torch.expm1, _any),
    "log2": (torch.log2, _pos),
    "log10": (torch.log10, _pos),
    "erf": (torch.erf, _any),
    "abs": (torch.abs, _any),
    "neg": (torch.neg, _any),
    "sign": (torch.sign, lambda: torch.tensor([[-2.0, 0.0, 3.5, -0.0]])),
    "reciprocal": (torch.reciprocal, _pos),
    "floor": (torch.floor, _any),
    "ceil": (torch.ceil, _any),
    "trunc": (torch.trunc, _any),
    "round_half_even": (torch.round, lambda: torch.tensor([[-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49, -3.7]])),
    "round_decimals": (
        lambda x: torch.round(x, decimals=2),
        lambda: torch.tensor([[1.2345, -0.125, 3.14159]]),
    ),
    "round_neg_decimals": (
        lambda x: torch.round(x, decimals=-1),
        lambda: torch.tensor([[15.0, 25.0, -34.0]]),
    ),
    "square": (torch.square, _any),
    "sin": (torch.sin, _any),
    "cos": (torch.cos, _any),
    "tan": (torch.tan, _unit),
    "asin": (torch.asin, _unit),
    "acos": (torch.acos, _unit),
    "atan": (torch.atan, _any),
    "sinh": (torch.sinh, _unit),
    "cosh": (torch.cosh, _unit),
    "asinh": (torch.asinh, _any),
    "acosh": (torch.acosh, lambda: _pos() + 1.0),
    "atanh": (torch.atanh, _unit),
    "exp_of_int": (torch.exp, lambda: torch.arange(-3, 3).reshape(2, 3)),
    "abs_int": (torch.abs, lambda: torch.arange(-3, 3).reshape(2, 3)),
}


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(tmp_path, frontend, name):
    fn, make = UNARY[name]
    export_and_check(Fn(fn), make(), tmp_path, frontend)


BINARY = {
    "pow_scalar_exp": (lambda x, y: x**3, _any),
    "pow_square_negative_base": (lambda x, y: torch.pow(x, 2), _any),
    "pow_fractional": (lambda x, y: torch.pow(x.abs(), 0.7), _any),
    "pow_negative_exp": (lambda x, y: torch.pow(x, -2), _pos),
    "pow_zero_int": (lambda x, y: x**0, _int),
    "square_int": (lambda x, y: torch.square(x), _int),
    "pow_tensor_tensor": (lambda x, y: torch.pow(x.abs(), y), _any),
    "pow_scalar_base": (lambda x, y: 2.0**x, _any),
    "pow_int_int": (lambda x, y: x**3, _int),
    "remainder": (torch.remainder, _any),
    "remainder_scalar": (lambda x, y: x % -1.5, _any),
    "fmod": (torch.fmod, _any),
    "fmod_scalar": (lambda x, y: torch.fmod(x, 1.5), _any),
    "floor_divide": (torch.floor_divide, _any),
    "floor_divide_scalar": (lambda x, y: x // 2, _any),
    "remainder_int": (torch.remainder, _int),
    "remainder_int_scalar": (lambda x, y: x % -3, _int),
    "fmod_int": (torch.fmod, _int),
    "floor_divide_int": (torch.floor_divide, _int),
    "floor_divide_int_scalar": (lambda x, y: x // 4, _int),
    "minimum": (torch.minimum, _any),
    "maximum": (torch.maximum, _any),
    "atan2": (torch.atan2, _any),
    "atan2_axes": (lambda x, y: torch.atan2(torch.sign(x).round(), torch.sign(y).round()), _any),
}


def test_broadcast_and_scalar_tensor(tmp_path, frontend):
    x, y = torch.randn(2, 3, 5), torch.randn(3, 1)
    model = Fn(lambda a, c: (torch.maximum(a, c), torch.minimum(c, a), torch.atan2(a, c), torch.pow(c, a)))
    export_and_check(model, (x, y.abs() + 0.1), tmp_path, frontend)


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(tmp_path, frontend, name):
    fn, make = BINARY[name]
    x, y = make(), make()
    y = torch.where(y.abs() < 0.1, torch.full_like(y, 3), y)  # no division by (near) zero
    export_and_check(Fn(fn), (x, y), tmp_path, frontend)


@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_cumulative(tmp_path, frontend, op, dim):
    x = torch.rand(3, 9, 5) + 0.5
    export_and_check(Fn(lambda t: getattr(torch, op)(t, dim)), x, tmp_path, frontend)


def test_cumsum_int_and_dtype(tmp_path, frontend):
    x = torch.arange(-6, 6).reshape(3, 4)
    model = Fn(
        lambda t: (torch.cumsum(t, 1), torch.cumsum(t > 0, 0), torch.cumsum(t, 1, dtype=torch.float32))
    )
    export_and_check(model, x, tmp_path, frontend)


def test_cube_and_square_root_are_torchs_special_cases(tmp_path, frontend):
    """``x ** 3`` is ``(x·x)·x`` and ``x ** 0.5`` is ``sqrt`` in torch, bit for bit (tract's pow
    is powf, ≤ 1 ulp off and ~100× slower): same products here, with inf, -0. and NaN."""
    x = torch.randn(4, 64) * 20
    x[0, :5] = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0, 0.0])
    model = Fn(lambda t: (t**3, torch.pow(t, 0.5), torch.pow(t, 3.0)))
    report = export_and_check(model, x, tmp_path, frontend)
    assert report.op_histogram["pow"] == 0
    assert all(e.max_abs == 0.0 for e in report.errors)

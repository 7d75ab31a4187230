"""Comparison and logic rules, run in tract and compared with PyTorch."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import export_and_check
from tests.test_rules_math import Fn


def _floats() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randint(-3, 4, (3, 4, 5)).float() / 2
    return x, torch.randint(-3, 4, (3, 4, 5)).float() / 2  # many ties, so eq/le/ge matter


@pytest.mark.parametrize("op", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_compare_tensor_and_scalar(tmp_path, frontend, op):
    fn = getattr(torch, op)
    model = Fn(lambda x, y, z: (fn(x, y), fn(x, 0.5), fn(x, 1), fn(x, z), fn(z, x)))
    export_and_check(model, (*_floats(), torch.tensor([[0.5], [-1.0], [0.0], [1.5]])), tmp_path, frontend)


@pytest.mark.parametrize("op", ["eq", "lt", "ge"])
def test_compare_int_with_float_scalar(tmp_path, frontend, op):
    fn = getattr(torch, op)
    x = torch.randint(-3, 4, (4, 6))
    export_and_check(Fn(lambda t, u: (fn(t, 0.5), fn(t, 1), fn(t, u))), (x, x.flip(0)), tmp_path, frontend)


def test_compare_bools(tmp_path, frontend):
    a, c = torch.rand(3, 7) > 0.5, torch.rand(3, 7) > 0.5
    export_and_check(Fn(lambda x, y: (x == y, x != y)), (a, c), tmp_path, frontend)


@pytest.mark.parametrize("op", ["logical_and", "logical_or", "logical_xor"])
def test_logical_binary(tmp_path, frontend, op):
    fn = getattr(torch, op)
    a, c = torch.rand(3, 7) > 0.5, torch.rand(3, 7) > 0.5
    floats = torch.randint(0, 2, (3, 7)).float() * torch.randn(3, 7)
    ints = torch.randint(-1, 2, (3, 7))
    model = Fn(lambda x, y, f, i: (fn(x, y), fn(f, y), fn(f, i), fn(i, x)))
    export_and_check(model, (a, c, floats, ints), tmp_path, frontend)


def test_logical_not_and_bitwise(tmp_path, frontend):
    a, c = torch.rand(3, 7) > 0.5, torch.rand(3, 7) > 0.5
    f = torch.randint(0, 2, (3, 7)).float()
    model = Fn(lambda x, y, z: (torch.logical_not(x), torch.logical_not(z), ~x, x & y, x | y, x ^ y))
    export_and_check(model, (a, c, f), tmp_path, frontend)


def test_isnan_isinf(tmp_path, frontend):
    x = torch.tensor([[1.0, float("nan"), float("inf"), -float("inf"), 0.0, -2.5]])
    model = Fn(
        lambda t: (torch.isnan(t), torch.isinf(t), torch.isposinf(t), torch.isneginf(t), torch.isfinite(t))
    )
    export_and_check(model, x, tmp_path, frontend)


@pytest.mark.parametrize("op", ["any", "all"])
def test_any_all(tmp_path, frontend, op):
    x = torch.rand(3, 4, 5) > 0.3
    f = torch.randint(0, 3, (3, 4, 5)).float()
    fn = getattr(torch, op)
    model = Fn(
        lambda t, u: (
            fn(t),
            fn(t, 1),
            fn(t, -1, keepdim=True),
            fn(u),
            fn(u, 0),
            fn(t, dim=(0, 2)),
            fn(t, dim=()),
        )
    )
    export_and_check(model, (x, f), tmp_path, frontend)

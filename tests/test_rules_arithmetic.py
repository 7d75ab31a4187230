from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.conftest import export_and_check


class Fn(nn.Module):
    def __init__(self, fn, const: torch.Tensor | None = None) -> None:
        super().__init__()
        self.fn = fn
        self.register_buffer("c", const if const is not None else torch.randn(4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.fn(x, y, self.c)


BINARY = {
    "add": lambda x, y, c: x + y,
    "add_alpha": lambda x, y, c: torch.add(x, y, alpha=-2.5),
    "add_scalar_left": lambda x, y, c: 3 + x,
    "add_scalar_alpha": lambda x, y, c: torch.add(x, 2.0, alpha=3),
    "add_inplace": lambda x, y, c: x.clone().add_(y),
    "sub": lambda x, y, c: x - y,
    "sub_alpha": lambda x, y, c: torch.sub(x, y, alpha=0.5),
    "rsub_scalar": lambda x, y, c: 1 - x,
    "rsub_tensor": lambda x, y, c: torch.rsub(x, y, alpha=2),
    "mul": lambda x, y, c: x * y,
    "mul_scalar_left": lambda x, y, c: 0.5 * x,
    "mul_buffer": lambda x, y, c: x * c,
    "div": lambda x, y, c: x / (y * y + 1),
    "div_scalar": lambda x, y, c: x / 3,
    "rdiv_buffer": lambda x, y, c: c / (x * x + 1),
    "div_trunc": lambda x, y, c: torch.div(x * 4, y * y + 0.5, rounding_mode="trunc"),
    "div_floor": lambda x, y, c: torch.div(x * 4, y + 0.01, rounding_mode="floor"),
    "ranks": lambda x, y, c: y + x,
    "chain": lambda x, y, c: (x - c) * (y + 2) / 4 - x,
}


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary(tmp_path, frontend, name):
    x, y = torch.randn(2, 3, 4), torch.randn(3, 1)
    if name == "ranks":
        y = torch.randn(4)
    export_and_check(Fn(BINARY[name]), (x, y), tmp_path, frontend)


INTEGER = {
    "int_add_float_scalar": lambda x, y, c: x + 0.5,
    "int_add_int_scalar": lambda x, y, c: (x + 1) * 2 - y,
    "int_true_div": lambda x, y, c: x / y,
    "int_floor_div": lambda x, y, c: torch.div(x, y, rounding_mode="floor"),
    "int_trunc_div": lambda x, y, c: torch.div(x, y, rounding_mode="trunc"),
    "int_mul_float_tensor": lambda x, y, c: x * c,
}


@pytest.mark.parametrize("name", sorted(INTEGER))
def test_integer_promotion(tmp_path, frontend, name):
    x = torch.randint(-20, 20, (3, 4))
    y = torch.tensor([3, -3, 7, -2])
    export_and_check(Fn(INTEGER[name]), (x, y), tmp_path, frontend)


CLAMP = {
    "min0": lambda x, y, c: torch.clamp(x, min=0),
    "min0_float": lambda x, y, c: torch.clamp(x, min=0.0),
    "max0": lambda x, y, c: torch.clamp(x, max=0.0),
    "both": lambda x, y, c: torch.clamp(x, -0.5, 0.5),
    "inverted": lambda x, y, c: torch.clamp(x, 1.0, -1.0),
    "clip": lambda x, y, c: torch.clip(x, -0.25, 0.75),
    "clamp_min": lambda x, y, c: torch.clamp_min(x, 0.1),
    "clamp_max": lambda x, y, c: torch.clamp_max(x, -0.1),
    "tensor_bounds": lambda x, y, c: torch.clamp(x, min=c - 1, max=c),
    "tensor_min_only": lambda x, y, c: torch.clamp(x, min=y),
    "inplace": lambda x, y, c: x.clone().clamp_(min=0),
}


@pytest.mark.parametrize("name", sorted(CLAMP))
def test_clamp(tmp_path, frontend, name):
    export_and_check(Fn(CLAMP[name]), (torch.randn(2, 3, 4), torch.randn(3, 1)), tmp_path, frontend)


def test_clamp_min_zero_is_a_bound(tmp_path, frontend):
    report = export_and_check(Fn(CLAMP["min0"]), (torch.randn(64), torch.randn(1)), tmp_path, frontend)
    # the NaN-keeping form (rules/nan.py): x < 0 ? 0 : x
    assert report.op_histogram["lt"] == 1 and report.op_histogram["select"] == 1

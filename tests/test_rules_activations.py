from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.conftest import export_and_check


class Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


MODULES = {
    "relu": nn.ReLU(),
    "relu_inplace": nn.ReLU(inplace=True),
    "relu6": nn.ReLU6(),
    "relu6_fn": Fn(F.relu6),
    "leaky_relu": nn.LeakyReLU(0.2),
    "elu": nn.ELU(),
    "elu_alpha": nn.ELU(alpha=0.3),
    "celu_like_elu_scaled": Fn(lambda x: torch.ops.aten.elu(x, 1.5, 2.0, 0.5)),
    "gelu": nn.GELU(),
    "gelu_tanh": nn.GELU(approximate="tanh"),
    "silu": nn.SiLU(),
    "sigmoid": nn.Sigmoid(),
    "tanh": nn.Tanh(),
    "hardswish": nn.Hardswish(),
    "hardsigmoid": nn.Hardsigmoid(),
    "hardtanh": nn.Hardtanh(-0.5, 2.0),
    "softplus": nn.Softplus(),
    "softplus_beta_threshold": nn.Softplus(beta=2.0, threshold=1.0),
    "softmax_last": nn.Softmax(dim=-1),
    "softmax_dim1": nn.Softmax(dim=1),
    "softmax_neg3": nn.Softmax(dim=-3),
    "log_softmax_last": nn.LogSoftmax(dim=-1),
    "log_softmax_dim0": nn.LogSoftmax(dim=0),
    "softmax_dtype": Fn(lambda x: torch.softmax(x, 1, dtype=torch.float64)),
}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_activation(tmp_path, frontend, name):
    x = torch.randn(2, 3, 5, 7) * 4  # wide enough to reach every branch (thresholds, saturation)
    export_and_check(MODULES[name], x, tmp_path, frontend, tolerance=1e-5)

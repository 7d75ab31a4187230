from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.conftest import export_and_check


class Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


CASES = {
    "mean_dim": lambda x: x.mean(1),
    "mean_neg_keep": lambda x: x.mean(-1, keepdim=True),
    "mean_list": lambda x: x.mean((2, 3)),
    "mean_list_neg_keep": lambda x: x.mean([-1, -3], keepdim=True),
    "mean_all": lambda x: x.mean(),
    "mean_dtype": lambda x: x.mean(1, dtype=torch.float64),
    "sum_dim": lambda x: x.sum(0),
    "sum_list_keep": lambda x: x.sum([1, -1], keepdim=True),
    "sum_all": lambda x: x.sum(),
    "sum_int": lambda x: (x * 10).to(torch.int32).sum(-1),
    "amax_dim": lambda x: x.amax(1),
    "amax_list_keep": lambda x: x.amax((-1, -2), keepdim=True),
    "amax_all": lambda x: x.amax(),
    "amin_dim": lambda x: x.amin(-2),
    "amin_list": lambda x: x.amin([0, 3]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_reduce(tmp_path, frontend, name):
    export_and_check(Fn(CASES[name]), torch.randn(2, 3, 4, 5), tmp_path, frontend, tolerance=1e-5)

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.conftest import export_and_check


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(3, 4), (2, 5, 4)])
def test_linear(tmp_path, frontend, bias, shape):
    model = nn.Sequential(nn.Linear(4, 8, bias=bias), nn.ReLU(), nn.Linear(8, 3, bias=bias))
    report = export_and_check(model, torch.randn(*shape), tmp_path, frontend)
    assert report.op_histogram["matmul"] == 2


class MatMul(nn.Module):
    def __init__(self, weight: torch.Tensor | None = None) -> None:
        super().__init__()
        self.weight = None if weight is None else nn.Parameter(weight)

    def forward(self, x: torch.Tensor, y: torch.Tensor | None = None) -> torch.Tensor:
        return torch.matmul(x, self.weight if y is None else y)


@pytest.mark.parametrize(
    "a, c",
    [
        ((3, 4), (4, 5)),
        ((2, 3, 4), (2, 4, 5)),
        ((2, 3, 4), (4, 5)),
        ((4,), (4, 5)),
        ((2, 3, 4), (4,)),
        ((4,), (4,)),
        ((2, 1, 3, 4), (5, 4, 2)),
    ],
)
def test_matmul_broadcast(tmp_path, frontend, a, c):
    export_and_check(MatMul(), (torch.randn(*a), torch.randn(*c)), tmp_path, frontend)


def test_matmul_constant_rhs(tmp_path, frontend):
    export_and_check(MatMul(torch.randn(4, 6)), torch.randn(2, 3, 4), tmp_path, frontend)


class Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn
        self.w = nn.Parameter(torch.randn(4, 5))
        self.b = nn.Parameter(torch.randn(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x, self.w, self.b)


@pytest.mark.parametrize(
    "fn",
    [
        lambda x, w, b: torch.mm(x, w),
        lambda x, w, b: torch.addmm(b, x, w),
        lambda x, w, b: torch.addmm(b, x, w, beta=0.5, alpha=2.0),
        lambda x, w, b: torch.addmm(b, x, w, beta=0.0),
        lambda x, w, b: torch.bmm(x.unsqueeze(0), w.unsqueeze(0)),
    ],
    ids=["mm", "addmm", "addmm_scaled", "addmm_beta0", "bmm"],
)
def test_mm_family(tmp_path, frontend, fn):
    export_and_check(Fn(fn), torch.randn(3, 4), tmp_path, frontend)

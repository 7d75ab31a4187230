"""cummax / cummin (values and indices, with ties) and logcumsumexp in tract vs PyTorch."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from tests.conftest import Fn, export_and_check

TIES = torch.tensor([[1.0, 3.0, 3.0, 2.0, 5.0, 5.0, 0.0], [4.0, 4.0, 1.0, 1.0, 6.0, -1.0, 6.0]])

CASES: dict[str, tuple[Callable[..., object], tuple[torch.Tensor, ...]]] = {
    "cummax": (lambda x: tuple(torch.cummax(x, 1)), (torch.randn(3, 9),)),
    "cummax_dim0": (lambda x: tuple(torch.cummax(x, 0)), (torch.randn(6, 2, 3),)),
    "cummax_ties": (lambda x: tuple(torch.cummax(x, -1)), (TIES,)),
    "cummin": (lambda x: tuple(torch.cummin(x, 1)), (torch.randn(3, 9),)),
    "cummin_ties": (lambda x: tuple(torch.cummin(x, 1)), (TIES,)),
    "logcumsumexp": (lambda x: torch.logcumsumexp(x, 1), (torch.randn(3, 9) * 4,)),
    "logcumsumexp_dim0": (lambda x: torch.logcumsumexp(x, 0), (torch.randn(5, 3),)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_scan(case: str, tmp_path, frontend) -> None:
    fn, args = CASES[case]
    export_and_check(Fn(fn), args, tmp_path, frontend)

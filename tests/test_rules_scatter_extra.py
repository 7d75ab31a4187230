"""index_copy / index_add / index_fill, select/slice/diagonal_scatter and Tensor.unfold in tract."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from tests.conftest import Fn, export_and_check


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


IDX = torch.tensor([3, 0, 2])


def _index_add_(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    y = x * 1
    y.index_add_(1, IDX, s)
    return y


def _index_copy_fill_(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    y = x * 1
    y.index_copy_(0, torch.tensor([2, 0]), s)
    y.index_fill_(1, torch.tensor([1]), -3.0)
    y.index_fill_(1, torch.tensor([3]), torch.tensor(5.0))
    return y


CASES: dict[str, tuple[Callable[..., object], tuple[torch.Tensor, ...]]] = {
    "index_copy": (lambda x, s: x.index_copy(1, IDX, s), (_r(2, 5, 3), _r(2, 3, 3))),
    "index_copy_dim0": (lambda x, s: torch.index_copy(x, 0, torch.tensor([1, 3]), s), (_r(4, 3), _r(2, 3))),
    "index_add": (
        lambda x, s: torch.index_add(x, 1, torch.tensor([1, 1, 4]), s, alpha=2.0),
        (_r(2, 5), _r(2, 3)),
    ),
    "index_add_": (_index_add_, (_r(2, 5, 3), _r(2, 3, 3))),
    "index_copy_fill_": (_index_copy_fill_, (_r(3, 4), _r(2, 4))),
    "index_fill": (lambda x: x.index_fill(1, IDX, -2.0), (_r(2, 5, 3),)),
    "index_fill_tensor": (lambda x: x.index_fill(0, torch.tensor([1]), torch.tensor(4.0)), (_r(3, 4),)),
    "index_fill_graph_index": (
        lambda x, i: x.index_fill(1, i, 7.0),
        (_r(3, 5), torch.tensor([4, 1])),
    ),
    "select_scatter": (lambda x, s: torch.select_scatter(x, s, 1, -1), (_r(2, 4, 3), _r(2, 3))),
    "select_scatter_first": (lambda x, s: torch.select_scatter(x, s, 0, 0), (_r(3, 4), _r(4))),
    "slice_scatter": (lambda x, s: torch.slice_scatter(x, s, 1, 1, 3), (_r(2, 5), _r(2, 2))),
    "slice_scatter_step": (lambda x, s: torch.slice_scatter(x, s, 0, 0, None, 2), (_r(5, 3), _r(3, 3))),
    "slice_scatter_tail": (lambda x, s: torch.slice_scatter(x, s, -1, 2), (_r(2, 5), _r(2, 3))),
    "diagonal_scatter": (lambda x, s: torch.diagonal_scatter(x, s), (_r(4, 5), _r(4))),
    "diagonal_scatter_offset": (
        lambda x, s: torch.diagonal_scatter(x, s, -1, 1, 2),
        (_r(2, 4, 3), _r(2, 3)),
    ),
    "unfold": (lambda x: x.unfold(1, 3, 2), (_r(2, 7, 3),)),
    "unfold_last": (lambda x: x.unfold(-1, 2, 1) * 2, (_r(3, 5),)),
    "unfold_1d": (lambda x: x.unfold(0, 4, 4), (_r(12),)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_scatter_extra(case: str, tmp_path, frontend) -> None:
    fn, args = CASES[case]
    export_and_check(Fn(fn), args, tmp_path, frontend)

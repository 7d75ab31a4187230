"""Creation: static creation folds to constants; ``*_like`` / ``new_*`` of graph tensors and
triu/tril of graph tensors run in tract and match PyTorch."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from tests.conftest import Fn, export_and_check


def check(fn: Callable[..., object], tmp_path, frontend, *args: torch.Tensor):
    return export_and_check(Fn(fn), args, tmp_path, frontend)


STATIC = {
    "arange": lambda x: torch.arange(4.0),
    "arange_start_step": lambda x: torch.arange(1, 9, 2, dtype=torch.float32),
    "zeros": lambda x: torch.zeros(4),
    "ones": lambda x: torch.ones(1, 4),
    "full": lambda x: torch.full((4,), 2.5),
    "eye": lambda x: torch.eye(4)[1],
    "linspace": lambda x: torch.linspace(-1, 1, 4),
    "triu_const": lambda x: torch.triu(torch.ones(4, 4), 1)[0],
}


@pytest.mark.parametrize("case", STATIC)
def test_static_creation_folds(tmp_path, frontend, case):
    """Static creation leaves no ops behind: only the stack of the input with a constant."""
    report = check(lambda x: torch.stack([x, STATIC[case](x).reshape(4)]), tmp_path, frontend, torch.randn(4))
    assert set(report.op_histogram) <= {"tract_core_external", "variable", "stack"}


LIKE = {
    "zeros_like": lambda x: torch.zeros_like(x),
    "ones_like": lambda x: torch.ones_like(x),
    "full_like": lambda x: torch.full_like(x, -3.25),
    "zeros_like_int": lambda x: torch.zeros_like(x, dtype=torch.int64),
    "ones_like_bool": lambda x: torch.ones_like(x, dtype=torch.bool),
    "full_like_int": lambda x: torch.full_like(x, 7, dtype=torch.int32),
    "new_zeros": lambda x: x.new_zeros(2, 3),
    "new_ones": lambda x: x.new_ones((5,)),
    "new_full": lambda x: x.new_full((2, 2), 1.5),
}


@pytest.mark.parametrize("case", LIKE)
def test_like_of_graph_tensor(tmp_path, frontend, case):
    x = torch.randn(3, 4, 5)
    report = check(lambda x: (LIKE[case](x), x[0]), tmp_path, frontend, x)
    assert report.weight_bytes <= 8, "a *_like must not write a full-size weight"
    assert report.op_histogram["tract_core_broadcast"] == 1


@pytest.mark.parametrize("diagonal", [0, 1, -1, 3, -4])
@pytest.mark.parametrize("upper", [True, False])
def test_triu_tril(tmp_path, frontend, diagonal, upper):
    fn = (lambda x: x.triu(diagonal)) if upper else (lambda x: torch.tril(x, diagonal))
    report = check(fn, tmp_path, frontend, torch.randn(2, 4, 5))
    assert report.op_histogram["tract_core_trilu"] == 1

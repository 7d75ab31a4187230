"""Selection rules (argmax/argmin, max/min with indices, topk, sort, argsort) in tract vs PyTorch."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from tests.conftest import Fn, export_and_check


def check(fn: Callable[..., object], tmp_path, frontend, *args: torch.Tensor):
    return export_and_check(Fn(fn), args, tmp_path, frontend)


def with_ties() -> torch.Tensor:
    """Small integers as floats: many ties, so first-occurrence and stability are exercised."""
    return torch.randint(0, 4, (3, 5, 6)).float()


ARGS = {
    "argmax_dim": lambda x: x.argmax(1),
    "argmax_keepdim_neg": lambda x: x.argmax(-1, keepdim=True),
    "argmax_none": lambda x: x.argmax(),
    "argmax_none_keepdim": lambda x: torch.argmax(x, keepdim=True),
    "argmin_dim": lambda x: x.argmin(0),
    "argmin_none": lambda x: x.argmin(),
    "max_dim": lambda x: x.max(1),
    "max_dim_keepdim": lambda x: torch.max(x, -1, keepdim=True),
    "min_dim": lambda x: x.min(2),
    "min_dim_keepdim": lambda x: x.min(0, True),
}


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("case", ARGS)
def test_arg_and_max_min(tmp_path, frontend, case, ties):
    x = with_ties() if ties else torch.randn(3, 5, 6)
    report = check(lambda x: ARGS[case](x), tmp_path, frontend, x)
    assert len(report.outputs) == (2 if case.startswith(("max", "min")) else 1)


TOPK = {
    "largest": lambda x: x.topk(3),
    "smallest_dim0": lambda x: torch.topk(x, 2, dim=0, largest=False),
    "k_all_neg_dim": lambda x: x.topk(5, dim=-2),
    "unsorted_values_sorted": lambda x: x.topk(4, sorted=False).values.sort().values,
    "sort": lambda x: x.sort(),
    "sort_desc_dim1": lambda x: x.sort(1, descending=True),
    "argsort": lambda x: x.argsort(0),
    "argsort_desc": lambda x: torch.argsort(x, descending=True),
}


@pytest.mark.parametrize("case", TOPK)
def test_topk_sort(tmp_path, frontend, case):
    report = check(lambda x: TOPK[case](x), tmp_path, frontend, torch.randn(3, 5, 6))
    assert report.op_histogram["tract_core_topk"] >= 1


@pytest.mark.parametrize("descending", [False, True])
def test_stable_sort_with_ties(tmp_path, frontend, descending):
    fn = lambda x: torch.sort(x, dim=-1, descending=descending, stable=True)  # noqa: E731
    check(fn, tmp_path, frontend, with_ties())

"""Extra reductions (min/max, prod, logsumexp, var/std, norms, aminmax) in tract vs PyTorch."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import export_and_check
from tests.test_rules_math import Fn


def test_global_min_max(tmp_path, frontend):
    x, y = torch.randn(3, 4, 5), torch.randn(3, 4, 5)
    model = Fn(lambda a, c: (a.max(), a.min(), torch.max(a, c), torch.min(a, c)))
    export_and_check(model, (x, y), tmp_path, frontend)


@pytest.mark.parametrize("dim", [None, 0, -1])
@pytest.mark.parametrize("keepdim", [False, True])
def test_aminmax(tmp_path, frontend, dim, keepdim):
    if dim is None and keepdim:
        pytest.skip("torch.aminmax keepdim without dim keeps nothing to compare")
    x = torch.randn(3, 4, 5)
    export_and_check(Fn(lambda a: torch.aminmax(a, dim=dim, keepdim=keepdim)), x, tmp_path, frontend)


def test_prod(tmp_path, frontend):
    x = torch.rand(3, 4, 5) + 0.5
    i = torch.randint(-3, 4, (3, 4))
    model = Fn(
        lambda a, n: (
            a.prod(),
            a.prod(1),
            a.prod(-1, keepdim=True),
            n.prod(0),
            a.prod(0, dtype=torch.float64),
        )
    )
    export_and_check(model, (x, i), tmp_path, frontend)


@pytest.mark.parametrize("dim", [1, -1, (0, 2)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_logsumexp(tmp_path, frontend, dim, keepdim):
    x = torch.randn(3, 4, 5) * 30  # large values: a naive log(sum(exp)) would overflow
    x[0, 0] = -float("inf")
    export_and_check(Fn(lambda a: torch.logsumexp(a, dim, keepdim=keepdim)), x, tmp_path, frontend)


@pytest.mark.parametrize("op", ["var", "std"])
def test_var_std(tmp_path, frontend, op):
    fn = getattr(torch, op)
    x = torch.randn(3, 4, 5) * 2 + 1
    model = Fn(
        lambda a: (
            fn(a),
            fn(a, unbiased=False),
            fn(a, 1),
            fn(a, (0, 2), keepdim=True),
            fn(a, -1, correction=0),
            fn(a, 1, correction=2),
            fn(a, 1, unbiased=False, keepdim=True),
        )
    )
    export_and_check(model, x, tmp_path, frontend)


def test_var_mean_std_mean(tmp_path, frontend):
    x = torch.randn(3, 4, 5)
    model = Fn(
        lambda a: (*torch.var_mean(a, 1), *torch.std_mean(a), *torch.std_mean(a, (0, 1), correction=0))
    )
    export_and_check(model, x, tmp_path, frontend)


@pytest.mark.parametrize("p", [1, 2, 3, 0.5, 0, float("inf"), -float("inf"), "fro"])
def test_norm(tmp_path, frontend, p):
    x = torch.randn(3, 4, 5)
    x[0, 0, :2] = 0.0
    if p == "fro":
        model = Fn(lambda a: (torch.norm(a, p="fro"), torch.norm(a, p="fro", dim=(1, 2))))
    else:
        model = Fn(
            lambda a: (
                torch.norm(a, p=p),
                torch.norm(a, p=p, dim=1),
                torch.linalg.vector_norm(a, ord=p, dim=(0, 2), keepdim=True),
            )
        )
    export_and_check(model, x, tmp_path, frontend)

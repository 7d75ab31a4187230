"""Products, einsum, cross, distances, bucketize and count_nonzero run in tract vs PyTorch."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.conftest import Fn, export_and_check


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


BOUNDS = torch.tensor([-1.0, -0.25, 0.0, 0.5, 1.2])

CASES: dict[str, tuple[Callable[..., object], tuple[torch.Tensor, ...]]] = {
    "dot": (lambda x, y: torch.dot(x, y), (_r(7), _r(7))),
    "vdot": (lambda x, y: torch.vdot(x, y) + x, (_r(7), _r(7))),
    "inner": (lambda x, y: torch.inner(x, y), (_r(2, 3, 5), _r(4, 5))),
    "mv": (lambda m, v: torch.mv(m, v), (_r(4, 6), _r(6))),
    "outer": (lambda x, y: torch.outer(x, y), (_r(4), _r(5))),
    "ger": (lambda x, y: torch.ger(x, y) * 2, (_r(4), _r(5))),
    "addmv": (lambda s, m, v: torch.addmv(s, m, v, beta=0.5, alpha=2.0), (_r(4), _r(4, 6), _r(6))),
    "addmv_beta0": (lambda s, m, v: torch.addmv(s, m, v, beta=0), (_r(4), _r(4, 6), _r(6))),
    "addr": (lambda s, x, y: torch.addr(s, x, y, beta=2.0, alpha=-1.0), (_r(4, 5), _r(4), _r(5))),
    "addbmm": (lambda s, x, y: torch.addbmm(s, x, y, alpha=0.5), (_r(3, 5), _r(2, 3, 4), _r(2, 4, 5))),
    "einsum_matmul": (lambda x, y: torch.einsum("bij,bjk->bik", x, y), (_r(2, 3, 4), _r(2, 4, 5))),
    "einsum_attn": (lambda q, k: torch.einsum("bhqd,bhkd->bhqk", q, k), (_r(1, 2, 3, 4), _r(1, 2, 5, 4))),
    "einsum_implicit": (lambda x, y: torch.einsum("ij,jk", x, y), (_r(3, 4), _r(4, 5))),
    "einsum_ellipsis": (lambda x, y: torch.einsum("...ij,...j->...i", x, y), (_r(2, 3, 4), _r(2, 4))),
    "einsum_transpose": (lambda x: torch.einsum("abc->cab", x), (_r(2, 3, 4),)),
    "einsum_sum_outer": (
        lambda x, y: torch.einsum("i,j->ij", x, y).sum(0) + torch.einsum("i->", x),
        (_r(3), _r(4)),
    ),
    "bilinear": (nn.Bilinear(4, 5, 3), (_r(2, 4), _r(2, 5))),
    "bilinear_nobias_3d": (nn.Bilinear(4, 5, 3, bias=False), (_r(2, 6, 4), _r(2, 6, 5))),
    "cross": (lambda x, y: torch.cross(x, y, dim=1), (_r(4, 3, 2), _r(4, 3, 2))),
    "linalg_cross": (lambda x, y: torch.linalg.cross(x, y), (_r(4, 3), _r(1, 3))),
    "cosine_similarity": (lambda x, y: F.cosine_similarity(x, y, dim=1), (_r(3, 6, 2), _r(3, 6, 2))),
    "cosine_similarity_bcast": (lambda x, y: F.cosine_similarity(x, y, dim=-1), (_r(3, 6), _r(1, 6))),
    "pairwise_distance": (lambda x, y: F.pairwise_distance(x, y), (_r(4, 6), _r(4, 6))),
    "pairwise_distance_p1": (
        lambda x, y: F.pairwise_distance(x, y, p=1.0, keepdim=True),
        (_r(4, 6), _r(4, 6)),
    ),
    "pairwise_distance_p3": (lambda x, y: F.pairwise_distance(x, y, p=3.0), (_r(4, 6), _r(4, 6))),
    "cdist": (lambda x, y: torch.cdist(x, y), (_r(2, 5, 3), _r(2, 4, 3))),
    "cdist_p1": (lambda x, y: torch.cdist(x, y, p=1.0), (_r(5, 3), _r(4, 3))),
    "cdist_inf": (lambda x, y: torch.cdist(x, y, p=float("inf")), (_r(5, 3), _r(4, 3))),
    "bucketize": (lambda x: torch.bucketize(x, BOUNDS), (_r(3, 4),)),
    "bucketize_right_i32": (lambda x: torch.bucketize(x, BOUNDS, right=True, out_int32=True), (_r(3, 4),)),
    "searchsorted": (lambda x: torch.searchsorted(BOUNDS, x), (_r(3, 4),)),
    "searchsorted_right": (lambda x: torch.searchsorted(BOUNDS, x, side="right"), (_r(3, 4),)),
    "count_nonzero": (lambda x: torch.count_nonzero(torch.relu(x)), (_r(3, 4),)),
    "count_nonzero_dim": (lambda x: torch.count_nonzero(torch.relu(x), dim=1), (_r(3, 4),)),
    "count_nonzero_dims": (lambda x: torch.count_nonzero(torch.relu(x), dim=(0, 2)), (_r(3, 4, 2),)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_linalg(case: str, tmp_path, frontend) -> None:
    fn, args = CASES[case]
    export_and_check(fn if isinstance(fn, nn.Module) else Fn(fn), args, tmp_path, frontend)

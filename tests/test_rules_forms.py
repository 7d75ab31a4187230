"""Call forms the held-out model sets refused: each runs in tract through every front end.

jit's in-place ``dropout_`` and ``reshape_as``, einsum diagonals, numbers from 0-d tensors
(``torch.arange(torch.tensor(n))``, ``torch.tensor(x.numel())``), FX's scalar-first arithmetic
(``torch.mul(2.0, x)``), ``torch.zeros(n, d)`` with traced sizes, ``torch.finfo(x.dtype)``,
the unsigned dtypes, the NumPy-style stacks and ``baddbmm`` (Bloom's ALiBi attention).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import nn

from tests.conftest import Fn, export_and_check


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _sizes_from_x(x: torch.Tensor) -> torch.Tensor:
    return (
        x @ torch.ones(x.size(1), x.size(1))
        + torch.zeros(x.size(0), x.size(1))
        + torch.full((x.shape[0], x.shape[1]), 2.0)
    )


def _unsigned(dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda x: (x * 10).abs().to(dtype).to(torch.float32) + 0.5


CASES: dict[str, tuple[Callable[..., object], tuple[torch.Tensor, ...]]] = {
    "reshape_as": (lambda x, y: x.reshape_as(y) + y, (_r(2, 6), _r(3, 4))),
    "view_as": (lambda x, y: x.view_as(y) * y, (_r(12), _r(3, 4))),
    "einsum_ii_i": (lambda x: torch.einsum("ii->i", x), (_r(4, 4),)),
    "einsum_trace": (lambda x: torch.einsum("ii", x), (_r(4, 4),)),
    "einsum_bii_bi": (lambda x: torch.einsum("bii->bi", x), (_r(2, 3, 3),)),
    "einsum_diag_then_product": (lambda x, y: torch.einsum("bii,bj->bij", x, y), (_r(2, 3, 3), _r(2, 4))),
    "arange_0d_end": (lambda x: x + torch.arange(torch.tensor(x.shape[-1])), (_r(2, 5),)),
    "arange_0d_start_end": (lambda x: x + torch.arange(torch.tensor(1), torch.tensor(6)), (_r(2, 5),)),
    "tensor_of_numel": (lambda x: x + torch.tensor(x.numel()), (_r(2, 5),)),
    "sizes_from_x": (_sizes_from_x, (_r(3, 4),)),
    "mul_number_first": (lambda x: torch.mul(2.0, x), (_r(3, 5),)),
    "sub_number_first": (lambda x: torch.sub(1, x), (_r(3, 5),)),
    "add_number_first": (lambda x: torch.add(1.5, x, alpha=2), (_r(3, 5),)),
    "div_number_first": (lambda x: torch.div(1.5, x), (_r(3, 5).abs() + 1,)),
    "finfo_of_traced_dtype": (
        lambda x: x.clamp(min=torch.finfo(x.dtype).min / 2) + torch.finfo(x.dtype).eps,
        (_r(3, 3),),
    ),
    "index_with_arange": (lambda x: x[torch.arange(x.shape[0]), torch.arange(x.shape[0])], (_r(3, 3),)),
    "unbind_sum": (lambda x: sum(torch.unbind(x, 1)), (_r(3, 4),)),
    "to_uint16": (_unsigned(torch.uint16), (_r(2, 5),)),
    "to_uint32": (_unsigned(torch.uint32), (_r(2, 5),)),
    "to_uint64": (_unsigned(torch.uint64), (_r(2, 5),)),
    "vstack": (lambda x, y, z: torch.vstack([x, y, z]), (_r(2, 5), _r(3, 5), _r(5))),
    "row_stack": (lambda x, y: torch.row_stack([x, y]), (_r(2, 5), _r(5))),
    "hstack": (lambda x, y: torch.hstack([x, y]), (_r(2, 5), _r(2, 3))),
    "hstack_1d": (lambda x, y: torch.hstack([x, y]), (_r(5), _r(3))),
    "dstack": (lambda x, y: torch.dstack([x, y]), (_r(2, 5), _r(2, 5))),
    "column_stack": (lambda x, y: torch.column_stack([x, y]), (_r(5), _r(5, 2))),
    "norm_fro": (lambda x: torch.norm(x, p="fro"), (_r(3, 5),)),
    "norm_fro_dims": (lambda x: torch.norm(x, p="fro", dim=(0, 1)), (_r(3, 5, 2),)),
    "baddbmm": (
        lambda b, x, y: torch.baddbmm(b, x, y, beta=0.5, alpha=2.0),
        (_r(2, 3, 5), _r(2, 3, 4), _r(2, 4, 5)),
    ),
    "baddbmm_alibi": (  # Bloom: ALiBi bias (B·H, 1, S) broadcast over the query axis
        lambda b, x, y: torch.baddbmm(b, x, y, beta=1.0, alpha=0.3),
        (_r(2, 1, 5), _r(2, 3, 4), _r(2, 4, 5)),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_forms(case: str, tmp_path, frontend) -> None:
    fn, args = CASES[case]
    export_and_check(Fn(fn), args, tmp_path, frontend)


def test_inplace_dropout_in_a_classifier(tmp_path, frontend) -> None:
    """MobileNetV3 / EfficientNet heads: ``nn.Dropout(inplace=True)`` is jit's ``aten::dropout_``."""
    model = nn.Sequential(nn.Linear(4, 6), nn.Hardswish(), nn.Dropout(0.2, inplace=True), nn.Linear(6, 3))
    export_and_check(model, (_r(2, 4),), tmp_path, frontend)

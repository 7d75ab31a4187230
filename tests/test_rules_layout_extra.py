"""fill/zero, swapaxes, tensor_split family, channel_shuffle, repeat_interleave, diff, diagonals,
take and take_along_dim run in tract and compared with PyTorch."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.conftest import Fn, export_and_check


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _fill_(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    y.fill_(2.5)
    return y + x


def _zero_(x: torch.Tensor) -> torch.Tensor:
    y = x.new_empty((3, 4))
    y.zero_()
    return y - x


CASES: dict[str, tuple[Callable[..., object], tuple[torch.Tensor, ...]]] = {
    "fill_": (_fill_, (_r(3, 4),)),
    "zero_": (_zero_, (_r(3, 4),)),
    "swapaxes": (lambda x: torch.swapaxes(x, 0, 2) * 2, (_r(2, 3, 4),)),
    "swapdims": (lambda x: x.swapdims(-1, 1) + 1, (_r(2, 3, 4),)),
    "tensor_split_sections": (lambda x: [t * 2 for t in torch.tensor_split(x, 3, dim=1)], (_r(2, 7),)),
    "tensor_split_indices": (lambda x: [t + 1 for t in torch.tensor_split(x, [1, -2], dim=-1)], (_r(2, 7),)),
    "hsplit": (lambda x: [t * 2 for t in torch.hsplit(x, 2)], (_r(3, 4, 2),)),
    "hsplit_array": (lambda x: [t * 2 for t in torch.hsplit(x, [1, 3])], (_r(3, 4, 2),)),
    "vsplit": (lambda x: [t * 2 for t in torch.vsplit(x, 3)], (_r(6, 4),)),
    "vsplit_array": (lambda x: [t * 2 for t in torch.vsplit(x, [2, 5])], (_r(6, 4),)),
    "dsplit_int": (lambda x: [t * 2 for t in torch.dsplit(x, 2)], (_r(2, 3, 4),)),
    "dsplit": (lambda x: [t * 2 for t in torch.dsplit(x, [2])], (_r(2, 3, 5),)),
    "channel_shuffle": (nn.ChannelShuffle(2), (_r(1, 6, 3, 3),)),
    "channel_shuffle_fn": (lambda x: F.channel_shuffle(x, 3), (_r(2, 6, 4),)),
    "repeat_interleave": (lambda x: torch.repeat_interleave(x, 2, dim=1), (_r(2, 3, 4),)),
    "repeat_interleave_flat": (lambda x: x.repeat_interleave(3), (_r(2, 3),)),
    "repeat_interleave_tensor": (
        lambda x: torch.repeat_interleave(x, torch.tensor([1, 3, 2]), dim=0),
        (_r(3, 4),),
    ),
    "diff": (lambda x: torch.diff(x), (_r(3, 6),)),
    "diff_n2_dim0": (lambda x: torch.diff(x, n=2, dim=0), (_r(5, 3),)),
    "diff_prepend_append": (
        lambda x, p, a: torch.diff(x, dim=1, prepend=p, append=a),
        (_r(2, 4), _r(2, 1), _r(2, 3)),
    ),
    "diagonal": (lambda x: torch.diagonal(x) * 2, (_r(4, 5),)),
    "diagonal_offset": (lambda x: torch.diagonal(x, 1, 0, 2), (_r(4, 3, 5),)),
    "diagonal_neg": (lambda x: x.diagonal(-2, -1, -2), (_r(2, 5, 4),)),
    "diag_embed": (lambda x: torch.diag_embed(x), (_r(2, 3),)),
    "diag_embed_offset_dims": (lambda x: torch.diag_embed(x, offset=-1, dim1=0, dim2=2), (_r(2, 3),)),
    "diag_vector": (lambda x: torch.diag(x, 1), (_r(4),)),
    "diag_matrix": (lambda x: torch.diag(x, -1), (_r(4, 5),)),
    "trace": (lambda x: torch.trace(x) + x, (_r(4, 5),)),
    "take": (lambda x: torch.take(x, torch.tensor([[0, 5], [-1, 7]])), (_r(3, 4),)),
    "take_along_dim": (lambda x: torch.take_along_dim(x, torch.argsort(x, dim=1), dim=1), (_r(3, 4),)),
    "take_along_dim_bcast": (
        lambda x: torch.take_along_dim(x, torch.tensor([[[0], [2]]]), dim=2),
        (_r(3, 2, 4),),
    ),
    "take_along_dim_flat": (lambda x: torch.take_along_dim(x, torch.tensor([3, 0, 11])), (_r(3, 4),)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_layout_extra(case: str, tmp_path, frontend) -> None:
    fn, args = CASES[case]
    export_and_check(fn if isinstance(fn, nn.Module) else Fn(fn), args, tmp_path, frontend)

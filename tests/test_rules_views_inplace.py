"""Writes through views (slice, select, narrow, diagonal, view, transpose) seen by every later reader.

``x[a:b] = v`` / ``fill_`` / ``copy_`` / ``zero_`` / in-place arithmetic on a view mutate the
base's storage in PyTorch; the artifact must scatter the write back into the base, and views of
the base taken *before* the write must read the new values. Each case runs in tract through
every front end and is compared with PyTorch on two different inputs.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import torchlower
from tests.conftest import Fn, export_and_check
from torchlower.errors import LoweringError


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _swin_mask(x: torch.Tensor) -> torch.Tensor:
    """Swin's shifted-window attention mask: regions of a zeros tensor filled with a counter."""
    m = torch.zeros(x.shape[-2], x.shape[-1])
    count = 0
    for h in (slice(0, -2), slice(-2, -1), slice(-1, None)):
        for w in (slice(0, -2), slice(-2, -1), slice(-1, None)):
            m[h, w] = count
            count += 1
    return x + m


def _fill_tensor(x: torch.Tensor) -> torch.Tensor:
    """``fill_.Tensor`` with a graph value (the mean) into a slice of a computed tensor."""
    y = x * 2
    y[:, 1:3] = x.mean()
    return y + 1


def _copy_into_slice(x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    z = x * 2
    z[:, :, 1:, 1:] = s[:, :, 1:, 1:] + 1
    return z * 3


def _zero_view_of_param_copy(x: torch.Tensor) -> torch.Tensor:
    bias = torch.arange(12.0) - 5
    bias[4:8].zero_()
    return x + bias


def _select_narrow_copy(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[:, 2].zero_()
    y.narrow(1, 0, 1).fill_(5.0)
    y[0, :, 1] = x[1, :, 0]
    return y - 1


def _diagonal_fill(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y.diagonal(dim1=-2, dim2=-1).fill_(0)
    return y + x


def _earlier_view_sees_write(x: torch.Tensor) -> torch.Tensor:
    """A view taken before the write (``v``) reads the new values afterwards."""
    y = x + 0
    v = y[1]
    y[1, 2:] = -4.0
    return v * 2 + y.sum()


def _inplace_arith_on_view(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[:, 1:].mul_(2)
    y[0].add_(10)
    return y


def _strided_slice_write(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y[:, ::2] = x[:, 1::2] * 0 + 7
    return y


def _through_transpose_and_view(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y.t()[0] = 3.0  # row 0 of the transpose is column 0
    y.view(-1)[2:5] = -1.0
    return y * 1


def _unsqueezed_view(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y.unsqueeze(0)[0, 1] = 9.0
    return y + 0


def _nested_views_base_is_view(x: torch.Tensor) -> torch.Tensor:
    """A write into a view of a view: both levels are scattered back."""
    y = x * 1
    inner = y[1:]
    inner[:, 0] = 0.5
    return y + inner.sum()


def _alias_or_copy(x: torch.Tensor) -> torch.Tensor:
    """``to`` / ``contiguous`` return their input itself when nothing changes (a write through
    them reaches it) and a copy otherwise (it does not)."""
    y = x * 1
    same = y.to(torch.float32)
    same[0] = 5.0
    y.contiguous().mul_(2)
    other = y.to(torch.float64)
    other[1] = -7.0
    return y + other.float()


CASES: dict[str, tuple[Callable[..., object], tuple[torch.Tensor, ...]]] = {
    "swin_mask": (_swin_mask, (_r(2, 6, 6),)),
    "fill_tensor": (_fill_tensor, (_r(3, 5),)),
    "copy_into_slice": (_copy_into_slice, (_r(1, 2, 4, 4), _r(1, 2, 4, 4))),
    "zero_view": (_zero_view_of_param_copy, (_r(3, 12),)),
    "select_narrow_copy": (_select_narrow_copy, (_r(2, 4, 3),)),
    "diagonal_fill": (_diagonal_fill, (_r(2, 4, 4),)),
    "earlier_view_sees_write": (_earlier_view_sees_write, (_r(3, 5),)),
    "inplace_arith_on_view": (_inplace_arith_on_view, (_r(3, 4),)),
    "strided_slice_write": (_strided_slice_write, (_r(3, 6),)),
    "through_transpose_and_view": (_through_transpose_and_view, (_r(3, 4),)),
    "unsqueezed_view": (_unsqueezed_view, (_r(3, 4),)),
    "nested_views": (_nested_views_base_is_view, (_r(4, 3),)),
    "alias_or_copy": (_alias_or_copy, (_r(3, 4),)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_write_through_view(case: str, tmp_path, frontend) -> None:
    fn, args = CASES[case]
    export_and_check(Fn(fn), args, tmp_path, frontend)
    other = tuple(torch.randn_like(a) * 3 for a in args)  # a second input: not one lucky example
    report = torchlower.export(Fn(fn), other, tmp_path / "again.nnef.tgz", frontend=frontend)
    assert all(e.ok for e in report.errors), [(e.name, e.max_abs) for e in report.errors]


def _write_through_unfold(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y.unfold(1, 2, 2).zero_()
    return y + 1


@pytest.mark.parametrize("frontend", ["jit", "fx"])
def test_write_through_view_without_inverse_is_refused(frontend: str, tmp_path) -> None:
    with pytest.raises(LoweringError, match="no functional inverse"):
        torchlower.export(Fn(_write_through_unfold), (_r(2, 6),), tmp_path / "m.nnef.tgz", frontend=frontend)
    assert not (tmp_path / "m.nnef.tgz").exists()


def test_buffer_is_not_mutated_by_folding(tmp_path) -> None:
    """A write into a view of a constant is folded on a copy: the model's buffer stays as it was."""

    class WithBuffer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("table", torch.arange(6.0))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            t = self.table.clone()
            t[1:3] = 0
            return x + t

    model = WithBuffer()
    export_and_check(model, (_r(2, 6),), tmp_path, "jit")
    assert torch.equal(model.table, torch.arange(6.0))

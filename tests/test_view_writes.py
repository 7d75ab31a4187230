"""In-place writes through views are never lost (issue 30, item 4).

A catalogue of the forms real models use (kornia's ``warp_affine`` pads a matrix and writes
its corner, ``H[..., -1, -1] += 1``) runs through every front end; under ``export`` both with
the full decomposition and with an op in the graph whose decomposition has no rule
(``torch.scalar_tensor``), which makes the front end keep ATen ops and only functionalize.
The export's own check compares with PyTorch on four inputs; a lost write is off by whole units.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlower


def _corner(x: torch.Tensor) -> torch.Tensor:
    h = F.pad(x, (0, 1, 0, 1))
    h[..., -1, -1] += 1
    return h


def _slice_mul(x: torch.Tensor) -> torch.Tensor:
    c = x.clone()
    c[:, 1:].mul_(2)
    return c


def _row_assign(x: torch.Tensor) -> torch.Tensor:
    c = x.clone()
    c[0] = 5.0
    return c


def _narrow_add(x: torch.Tensor) -> torch.Tensor:
    c = x * 1
    c.narrow(2, 0, 2).add_(1)
    return c


def _diagonal_fill(x: torch.Tensor) -> torch.Tensor:
    c = x.clone()
    c.diagonal(dim1=-2, dim2=-1).fill_(0)
    return c


def _strided_flat_zero(x: torch.Tensor) -> torch.Tensor:
    c = x.clone()
    c.view(-1)[::2].zero_()
    return c


def _transposed_row_sub(x: torch.Tensor) -> torch.Tensor:
    c = x.clone()
    c.transpose(1, 2)[:, 0].sub_(3)
    return c


FORMS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    f.__name__.strip("_"): f
    for f in (
        _corner,
        _slice_mul,
        _row_assign,
        _narrow_add,
        _diagonal_fill,
        _strided_flat_zero,
        _transposed_row_sub,
    )
}


class Form(nn.Module):
    def __init__(self, form: Callable[[torch.Tensor], torch.Tensor], keep_aten: bool) -> None:
        super().__init__()
        self.form, self.keep_aten = form, keep_aten

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.form(x)
        return y * torch.scalar_tensor(2.0) if self.keep_aten else y


@pytest.mark.parametrize(
    ("frontend", "keep_aten"), [("jit", False), ("fx", False), ("export", False), ("export", True)]
)
@pytest.mark.parametrize("name", sorted(FORMS))
def test_view_write_survives(name: str, frontend: str, keep_aten: bool, tmp_path: Path) -> None:
    model = Form(FORMS[name], keep_aten).eval()
    x = torch.randn(2, 3, 3)
    report = torchlower.export(model, x, tmp_path / "m.nnef.tgz", frontend=frontend)
    assert report.frontend == frontend
    assert report.max_abs_error < 1e-5 and len(report.points) >= 4, report.points
    with torch.no_grad():
        want = model(x)
    assert not torch.equal(want, Form(lambda t: t, keep_aten)(x)), "the write changes the result"

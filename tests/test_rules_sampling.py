"""grid_sample (every mode × padding × align_corners tract matches), F.unfold and F.fold in tract."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

import torchlower
from tests.conftest import Fn, export_and_check
from torchlower.errors import LoweringError


def _grid(*shape: int) -> torch.Tensor:
    """Sampling positions reaching 30% outside [-1, 1], so every padding mode is exercised."""
    return torch.rand(*shape) * 2.6 - 1.3


def _sampler(mode: str, padding: str, align: bool) -> Callable[..., torch.Tensor]:
    return lambda x, g: F.grid_sample(x, g, mode=mode, padding_mode=padding, align_corners=align)


GRID_CASES = [
    (mode, padding, align)
    for mode in ("bilinear", "nearest", "bicubic")
    for padding in ("zeros", "border", "reflection")
    for align in (False, True)
    if not (mode == "bicubic" and padding == "border")
]


@pytest.mark.parametrize(("mode", "padding", "align"), GRID_CASES)
def test_grid_sample(mode: str, padding: str, align: bool, tmp_path, frontend) -> None:
    export_and_check(
        Fn(_sampler(mode, padding, align)), (torch.randn(2, 3, 5, 6), _grid(2, 4, 7, 2)), tmp_path, frontend
    )


def test_grid_sample_3d(tmp_path, frontend) -> None:
    fn = _sampler("bilinear", "border", False)
    export_and_check(Fn(fn), (torch.randn(1, 2, 3, 4, 5), _grid(1, 2, 3, 4, 3)), tmp_path, frontend)


def test_grid_sample_flow_warp(tmp_path, frontend) -> None:
    """RAFT-style warping: the grid is computed in the graph from a flow field."""

    def warp(x: torch.Tensor, flow: torch.Tensor) -> torch.Tensor:
        n, _, h, w = x.shape
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
        base = torch.stack([xs, ys], dim=-1).expand(n, h, w, 2)
        return F.grid_sample(x, base + flow.permute(0, 2, 3, 1) * 0.1, align_corners=True)

    export_and_check(Fn(warp), (torch.randn(2, 3, 6, 5), torch.randn(2, 2, 6, 5)), tmp_path, frontend)


def test_grid_sampler_aten_overloads(tmp_path, frontend) -> None:
    """The dimension-specific ATen ops (what some graphs call directly)."""

    def both(
        x: torch.Tensor, g: torch.Tensor, x3: torch.Tensor, g3: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        return torch.ops.aten.grid_sampler_2d(x, g, 0, 2, False), torch.ops.aten.grid_sampler_3d(
            x3, g3, 1, 1, True
        )

    args = (torch.randn(1, 2, 4, 5), _grid(1, 3, 3, 2), torch.randn(1, 2, 3, 4, 5), _grid(1, 2, 2, 2, 3))
    export_and_check(Fn(both), args, tmp_path, frontend)


def test_grid_sample_bicubic_border_is_refused(tmp_path) -> None:
    with pytest.raises(LoweringError, match="bicubic"):
        torchlower.export(
            Fn(_sampler("bicubic", "border", False)), (torch.randn(1, 2, 4, 4), _grid(1, 3, 3, 2)),
            tmp_path / "m.nnef.tgz",
        )  # fmt: skip


FOLD_CASES: dict[str, tuple[Callable[..., object], tuple[torch.Tensor, ...]]] = {
    "unfold_pad_stride": (lambda x: F.unfold(x, 3, padding=1, stride=2), (torch.randn(2, 3, 6, 7),)),
    "unfold_dilation": (lambda x: F.unfold(x, (2, 3), dilation=(2, 1)), (torch.randn(1, 2, 6, 7),)),
    "fold_pad_stride": (lambda x: F.fold(x, (6, 7), 3, padding=1, stride=2), (torch.randn(2, 27, 12),)),
    "fold_overlapping": (lambda x: F.fold(x, (5, 5), 2), (torch.randn(1, 8, 16),)),
    "unfold_then_fold": (
        lambda x: F.fold(F.unfold(x, 3, padding=1), (5, 6), 3, padding=1),
        (torch.randn(1, 2, 5, 6),),
    ),
}


@pytest.mark.parametrize("case", sorted(FOLD_CASES))
def test_unfold_fold(case: str, tmp_path, frontend) -> None:
    fn, args = FOLD_CASES[case]
    export_and_check(Fn(fn), args, tmp_path, frontend)

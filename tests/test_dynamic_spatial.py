"""Dynamic height/width for CNNs and dynamic repeat counts: one artifact, run in tract at several
sizes per symbol (1 included), each compared with PyTorch (``test_dynamic.export_dynamic``)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.test_dynamic import DYNAMIC_FRONTENDS, export_dynamic
from torchlower.errors import LoweringError

HW = {"input": {2: "S", 3: "B"}}  # the symbols of test_dynamic.SIZES: H in (1, 4, 9), W in (1, 3, 5)


def _cnn(*layers: nn.Module) -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), *layers)


CASES = {
    "max_pool_3x3_s1": _cnn(nn.MaxPool2d(3, 1, 1)),
    "max_pool_resnet_stem": nn.Sequential(nn.Conv2d(3, 4, 7, 2, 3), nn.MaxPool2d(3, 2, 1)),
    "avg_pool_3x3_s1": _cnn(nn.AvgPool2d(3, 1, 1, count_include_pad=False)),
    "global_average": _cnn(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2)),
    "upsample_nearest_x2": _cnn(nn.Upsample(scale_factor=2, mode="nearest")),
    "upsample_bilinear_x2": _cnn(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)),
    "upsample_bilinear_x3": _cnn(nn.Upsample(scale_factor=3, mode="bilinear", align_corners=False)),
}


@pytest.mark.parametrize("frontend", DYNAMIC_FRONTENDS)
@pytest.mark.parametrize("case", sorted(CASES))
def test_dynamic_height_and_width(case: str, frontend: str, tmp_path) -> None:
    # the ResNet stem under torch.export: it guards "conv / pool output size != 1" and would pin H
    # and W; it is exported size-oblivious and checked at H = W = 1 too (frontends/export.py)
    export_dynamic(CASES[case], (torch.randn(1, 3, 8, 6),), tmp_path, frontend, HW)


def test_dynamic_upsample_needs_whole_factors(tmp_path) -> None:
    model = _cnn(nn.Upsample(scale_factor=1.5, mode="bilinear", align_corners=False))
    with pytest.raises(LoweringError, match=r"whole scale factors|cannot be dynamic"):
        export_dynamic(model, (torch.randn(1, 3, 8, 6),), tmp_path, "jit", HW)


class _Interleave(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.repeat_interleave(2, dim=1) + x.repeat_interleave(1, dim=1).repeat(1, 2, 1)


@pytest.mark.parametrize("frontend", DYNAMIC_FRONTENDS)
def test_repeat_interleave_on_a_dynamic_axis(frontend: str, tmp_path) -> None:
    export_dynamic(_Interleave(), (torch.randn(2, 4, 3),), tmp_path, frontend, {"x": {1: "S"}})

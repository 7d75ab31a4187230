from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.conftest import export_and_check

POOLS = {
    "max1d": (nn.MaxPool1d(3, 2), (2, 3, 11)),
    "max1d_pad_ceil": (nn.MaxPool1d(3, 2, padding=1, ceil_mode=True), (2, 3, 10)),
    "max2d": (nn.MaxPool2d(2), (2, 3, 8, 9)),
    "max2d_pad_dil": (nn.MaxPool2d(3, 2, padding=1, dilation=2), (1, 3, 9, 10)),
    "max2d_ceil": (nn.MaxPool2d(3, 2, ceil_mode=True), (1, 3, 8, 10)),
    "max2d_ceil_pad": (nn.MaxPool2d((3, 2), (2, 3), padding=1, ceil_mode=True), (1, 3, 8, 10)),
    "max2d_unbatched": (nn.MaxPool2d(2), (3, 6, 6)),
    "max3d": (nn.MaxPool3d(2, padding=1), (1, 2, 5, 6, 7)),
    "avg1d": (nn.AvgPool1d(3, 2), (2, 3, 11)),
    "avg1d_pad_excl": (nn.AvgPool1d(3, 2, padding=1, count_include_pad=False), (2, 3, 11)),
    "avg1d_ceil": (nn.AvgPool1d(3, 2, padding=1, ceil_mode=True), (2, 3, 10)),
    "avg2d": (nn.AvgPool2d(2), (2, 3, 8, 9)),
    "avg2d_pad_incl": (nn.AvgPool2d(3, 2, padding=1), (1, 3, 9, 10)),
    "avg2d_pad_excl": (nn.AvgPool2d(3, 2, padding=1, count_include_pad=False), (1, 3, 9, 10)),
    "avg2d_ceil_incl": (nn.AvgPool2d(3, 2, padding=1, ceil_mode=True), (1, 3, 8, 10)),
    "avg2d_ceil_excl": (
        nn.AvgPool2d(3, 2, padding=1, ceil_mode=True, count_include_pad=False),
        (1, 3, 8, 10),
    ),
    "avg2d_ceil_nopad": (nn.AvgPool2d(3, 2, ceil_mode=True), (1, 3, 8, 10)),
    "avg2d_divisor_override": (nn.AvgPool2d(3, 2, padding=1, divisor_override=5), (1, 3, 9, 10)),
    "avg3d": (nn.AvgPool3d(2, padding=1, count_include_pad=False), (1, 2, 5, 6, 7)),
    "adaptive_avg1d_5_of_11": (nn.AdaptiveAvgPool1d(5), (2, 3, 11)),
    "adaptive_avg2d_1": (nn.AdaptiveAvgPool2d(1), (2, 3, 7, 9)),
    "adaptive_avg2d_divisible": (nn.AdaptiveAvgPool2d((4, 3)), (2, 3, 8, 9)),
    "adaptive_avg2d_3x5_of_7x9": (nn.AdaptiveAvgPool2d((3, 5)), (2, 3, 7, 9)),
    "adaptive_avg2d_none": (nn.AdaptiveAvgPool2d((None, 4)), (2, 3, 7, 9)),
    "adaptive_avg2d_upsample": (nn.AdaptiveAvgPool2d((9, 11)), (1, 2, 7, 9)),
    "adaptive_avg3d_divisible": (nn.AdaptiveAvgPool3d((2, 3, 1)), (1, 2, 4, 6, 5)),
    "adaptive_max1d_4_of_10": (nn.AdaptiveMaxPool1d(4), (2, 3, 10)),
    "adaptive_max2d_1": (nn.AdaptiveMaxPool2d(1), (2, 3, 7, 9)),
    "adaptive_max2d_3x4_of_7x9": (nn.AdaptiveMaxPool2d((3, 4)), (2, 3, 7, 9)),
}


@pytest.mark.parametrize("name", sorted(POOLS))
def test_pool(tmp_path, frontend, name):
    model, shape = POOLS[name]
    x = torch.randn(*shape) - 3.0  # mostly negative: a zero-padded max would show
    export_and_check(model, x, tmp_path, frontend, tolerance=1e-5)

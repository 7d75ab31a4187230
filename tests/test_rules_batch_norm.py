from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.conftest import export_and_check
from torchlower.errors import LoweringError


def _randomized(bn: nn.Module) -> nn.Module:
    """Non-trivial running statistics and affine parameters, so a wrong fold cannot pass."""
    with torch.no_grad():
        bn.running_mean.uniform_(-2, 2)
        bn.running_var.uniform_(0.1, 3)
        if bn.affine:
            bn.weight.uniform_(-2, 2)
            bn.bias.uniform_(-1, 1)
    return bn


@pytest.mark.parametrize(
    "bn, shape",
    [
        (nn.BatchNorm1d(5), (4, 5)),
        (nn.BatchNorm1d(5, eps=1e-3), (2, 5, 7)),
        (nn.BatchNorm2d(3), (2, 3, 6, 5)),
        (nn.BatchNorm2d(3, affine=False), (1, 3, 4, 4)),
        (nn.BatchNorm3d(2), (1, 2, 3, 4, 5)),
    ],
    ids=["1d_2d_input", "1d_eps", "2d", "2d_no_affine", "3d"],
)
def test_batch_norm_eval(tmp_path, frontend, bn, shape):
    report = export_and_check(_randomized(bn), torch.randn(*shape), tmp_path, frontend, tolerance=1e-5)
    assert report.op_histogram["mul"] == 1 and report.op_histogram["add"] == 1  # folded at export


def test_conv_bn_relu(tmp_path, frontend):
    model = nn.Sequential(nn.Conv2d(3, 4, 3), _randomized(nn.BatchNorm2d(4)), nn.ReLU())
    export_and_check(model, torch.randn(2, 3, 8, 8), tmp_path, frontend, tolerance=1e-5)


def test_batch_statistics_rejected(tmp_path, frontend):
    bn = nn.BatchNorm2d(3, track_running_stats=False)
    with pytest.raises(LoweringError, match="training"):
        export_and_check(bn, torch.randn(2, 3, 4, 4), tmp_path, frontend)

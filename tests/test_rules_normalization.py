from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.conftest import export_and_check


def _randomize(model: nn.Module) -> nn.Module:
    """Non-trivial affine parameters, so a dropped weight or bias cannot pass."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
    return model


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("normalized", [(8,), (5, 8), (3, 5, 8)])
def test_layer_norm(tmp_path, frontend, affine, normalized):
    model = _randomize(nn.LayerNorm(normalized, eps=1e-3, elementwise_affine=affine))
    x = torch.randn(2, 3, 5, 8) * 3 + 1
    report = export_and_check(model, x, tmp_path, frontend)
    # mean and variance; a one-axis norm's mean is a sum in tract graphs (nnef/norms.py)
    assert report.op_histogram["mean_reduce"] + report.op_histogram["sum_reduce"] == 2
    numel = torch.Size(normalized).numel()
    assert report.weight_bytes == (2 * 4 * numel if affine else 0)  # eps is a literal, not a weight


class BiasOnlyLayerNorm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("bias", torch.linspace(-1, 1, 6))

    def forward(self, x):
        return F.layer_norm(x, (6,), None, self.bias, 1e-5)


def test_layer_norm_bias_only(tmp_path, frontend):
    export_and_check(BiasOnlyLayerNorm(), torch.randn(4, 6), tmp_path, frontend)


@pytest.mark.parametrize(("groups", "channels"), [(1, 6), (2, 6), (3, 6), (6, 6)])
@pytest.mark.parametrize("spatial", [(7,), (4, 5)])
def test_group_norm(tmp_path, frontend, groups, channels, spatial):
    model = _randomize(nn.GroupNorm(groups, channels, eps=1e-2))
    x = torch.randn(2, channels, *spatial) * 2 + torch.arange(channels).reshape(-1, *[1] * len(spatial))
    export_and_check(model, x, tmp_path, frontend)


def test_group_norm_no_affine(tmp_path, frontend):
    export_and_check(nn.GroupNorm(2, 4, affine=False), torch.randn(3, 4, 5, 5), tmp_path, frontend)


@pytest.mark.parametrize("cls", [nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d])
@pytest.mark.parametrize("affine", [True, False])
def test_instance_norm(tmp_path, frontend, cls, affine):
    dims = {nn.InstanceNorm1d: (9,), nn.InstanceNorm2d: (4, 5), nn.InstanceNorm3d: (3, 4, 2)}[cls]
    model = _randomize(cls(3, affine=affine))
    export_and_check(model, torch.randn(2, 3, *dims) * 2 + 1, tmp_path, frontend)


def test_instance_norm_running_stats(tmp_path, frontend):
    model = nn.InstanceNorm2d(3, affine=True, track_running_stats=True)
    with torch.no_grad():
        model.running_mean.copy_(torch.tensor([0.5, -1.0, 2.0]))
        model.running_var.copy_(torch.tensor([0.25, 2.0, 4.0]))
        model.weight.copy_(torch.tensor([1.5, -0.5, 2.0]))
    export_and_check(model, torch.randn(2, 3, 4, 4), tmp_path, frontend)


@pytest.mark.parametrize("normalized", [(8,), (4, 8)])
@pytest.mark.parametrize("eps", [None, 1e-2])
@pytest.mark.parametrize("affine", [True, False])
def test_rms_norm(tmp_path, frontend, normalized, eps, affine):
    model = _randomize(nn.RMSNorm(normalized, eps=eps, elementwise_affine=affine))
    export_and_check(model, torch.randn(3, 4, 8) * 0.01, tmp_path, frontend)


def test_instance_norm_unbatched(tmp_path, frontend):
    model = _randomize(nn.InstanceNorm1d(3, affine=True))
    export_and_check(model, torch.randn(3, 9), tmp_path, frontend)

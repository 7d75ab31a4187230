"""tract 0.23.9's einsum declutter on a broadcast concatenated into a 1×1 conv (issue 30 item 7):
ECAPA-TDNN's attentive statistics pooling (speechbrain) failed to load ("Trying to substitute a
2,8,100,F32 by 2,8,1,F32"); ``nnef/guards_einsum.py`` writes the broadcast as a product with ones."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlower
from tests.conftest import export_and_check
from torchlower.nnef.tract import run_in_tract


class AttentiveStatsPooling(nn.Module):
    """speechbrain.lobes.models.ECAPA_TDNN.AttentiveStatisticsPooling (global context, no lengths)."""

    def __init__(self, channels: int = 16, attention: int = 8, repeat: bool = True) -> None:
        super().__init__()
        self.tdnn = nn.Sequential(nn.Conv1d(3 * channels, attention, 1), nn.ReLU(), nn.BatchNorm1d(attention))
        self.conv = nn.Conv1d(attention, channels, 1)
        self.repeat = repeat

    @staticmethod
    def _stats(x: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = (m * x).sum(2)
        return mean, torch.sqrt((m * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(1e-12))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        steps = x.shape[-1]
        mask = torch.ones_like(x[:, :1]) / steps
        mean, std = self._stats(x, mask)
        if self.repeat:
            mean, std = mean.unsqueeze(2).repeat(1, 1, steps), std.unsqueeze(2).repeat(1, 1, steps)
        else:
            mean, std = mean.unsqueeze(2).expand_as(x), std.unsqueeze(2).expand_as(x)
        attn = self.conv(torch.tanh(self.tdnn(torch.cat([x, mean, std], dim=1))))
        mean, std = self._stats(x, F.softmax(attn, dim=2))
        return torch.cat((mean, std), dim=1).unsqueeze(2)


@pytest.mark.parametrize("repeat", [True, False], ids=["repeat", "expand"])
def test_attentive_pooling_loads_and_matches(repeat: bool, frontend: str, tmp_path: Path) -> None:
    report = export_and_check(
        AttentiveStatsPooling(repeat=repeat), (torch.randn(2, 16, 100),), tmp_path, frontend
    )
    assert report.max_abs_error < 1e-5


def test_attentive_pooling_with_dynamic_time(frontend: str, tmp_path: Path) -> None:
    model = AttentiveStatsPooling().eval()
    report = torchlower.export(
        model, (torch.randn(2, 16, 100),), tmp_path / "m.nnef.tgz", frontend=frontend,
        input_names=["x"], dynamic_axes={"x": {2: "T"}},
    )  # fmt: skip
    assert report.inputs[0].shape == (2, 16, "T")
    for steps in (37, 250):
        x = torch.randn(2, 16, steps)
        got = run_in_tract(report.path, [x.numpy()])[0]
        assert float(abs(torch.from_numpy(got) - model(x).detach()).max()) < 1e-5


def test_guard_is_scoped(tmp_path: Path) -> None:
    """A tile read by a concat that no conv or matmul reads is left as it is."""

    class TileConcat(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.cat([x, x.mean(2, keepdim=True).repeat(1, 1, x.shape[2])], 1) * 2

    report = export_and_check(TileConcat(), (torch.randn(2, 4, 10),), tmp_path)
    with tarfile.open(report.path) as tar:
        graph = tar.extractfile("graph.nnef").read().decode()  # type: ignore[union-attr]
    assert "tile(" in graph and "_ones" not in graph

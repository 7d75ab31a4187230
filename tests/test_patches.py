"""Patch embeddings as a matmul (torchlower/nnef/patches.py): same numbers in tract, no conv left.

Each case is exported with and without the pass and both artifacts run in tract on several
random inputs; they must agree with each other and with PyTorch to f32 rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import torchlower
from torchlower.nnef import patches
from torchlower.nnef.tract import run_points_in_tract


class Patchify(nn.Module):
    """conv (kernel = stride) → flatten → transpose → layer norm → linear, as in a ViT."""

    def __init__(self, conv: nn.Module) -> None:
        super().__init__()
        self.conv, self.norm, self.fc = conv, nn.LayerNorm(conv.out_channels), nn.Linear(conv.out_channels, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.norm(self.conv(x).flatten(2).transpose(1, 2)))


CASES = {
    "2d": (nn.Conv2d(3, 16, 4, 4), (2, 3, 8, 12), 0),
    "2d-no-bias": (nn.Conv2d(3, 16, (2, 4), (2, 4), bias=False), (1, 3, 6, 8), 0),
    "2d-one-window": (nn.Conv2d(2, 16, (4, 3), (4, 3)), (1, 2, 4, 9), 0),  # stride written as 1 on H
    "1d": (nn.Conv1d(4, 16, 5, 5), (1, 4, 20), 0),
    "overlapping": (nn.Conv2d(3, 16, 4, 2), (1, 3, 8, 8), 1),  # not patches: the conv stays
    "padded": (nn.Conv2d(3, 16, 4, 4, padding=1), (1, 3, 6, 6), 1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_patch_conv_as_matmul_matches(case, monkeypatch, tmp_path):
    conv, shape, convs_left = CASES[case]
    torch.manual_seed(0)
    model = Patchify(conv).eval()
    x = torch.randn(*shape)
    with monkeypatch.context() as m:
        m.setattr(patches, "patch_matmul", lambda b: False)
        plain = torchlower.export(model, x, tmp_path / "plain.nnef.tar", check=False)
    new = torchlower.export(model, x, tmp_path / "new.nnef.tar")  # the export's own check passes too
    assert plain.op_histogram["conv"] == 1 and new.op_histogram["conv"] == convs_left
    rng = np.random.default_rng(16)
    points = [[rng.standard_normal(shape, dtype=np.float32) * s] for s in (1.0, 3.0, 0.1)]
    a, b = run_points_in_tract(plain.path, points), run_points_in_tract(new.path, points)
    for (p,), (ya,), (yb,) in zip(points, a, b, strict=True):
        with torch.no_grad():
            want = model(torch.from_numpy(p)).numpy()
        assert np.abs(yb - want).max() <= 2e-5 * max(1.0, np.abs(want).max())
        assert np.abs(yb - ya).max() <= 2e-5 * max(1.0, np.abs(want).max())

"""Resizing to a size with symbols of its own (issue 28, item 5 and the FX fallback).

An FPN / U-Net decoder resizes a feature map to its skip connection's size,
``F.interpolate(x, size=skip.shape[2:])``; when the two maps have independent symbols the
ratio is no whole factor, so torch's source indices are computed in the graph from both
sizes. Every front end, every mode, checked in tract at sizes far from the captures.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlower
from torchlower.nnef.tract import run_in_tract


class ToSkip(nn.Module):
    def __init__(self, mode: str, align: bool | None) -> None:
        super().__init__()
        self.mode, self.align = mode, align

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        extra = {} if self.mode.startswith("nearest") else {"align_corners": self.align}
        return F.interpolate(x, size=skip.shape[-2:], mode=self.mode, **extra) + skip


@pytest.mark.parametrize("frontend", ["jit", "fx", "export"])
@pytest.mark.parametrize(
    ("mode", "align"), [("nearest", None), ("nearest-exact", None), ("bilinear", False), ("bilinear", True)]
)
def test_resize_to_a_skip_connection_of_its_own_size(
    frontend: str, mode: str, align: bool | None, tmp_path: Path
) -> None:
    model = ToSkip(mode, align)
    report = torchlower.export(
        model, (torch.randn(1, 3, 8, 8), torch.randn(1, 3, 16, 16)), tmp_path / "m.nnef.tgz",
        frontend=frontend, dynamic_axes={"x": {2: "h", 3: "w"}, "skip": {2: "H", 3: "W"}},
    )  # fmt: skip
    assert report.frontend == frontend and report.inputs[1].shape == (1, 3, "H", "W")
    for h, w, big_h, big_w in ((5, 7, 13, 6), (9, 4, 9, 4), (3, 3, 17, 1), (11, 12, 5, 7)):
        x, skip = torch.randn(1, 3, h, w), torch.randn(1, 3, big_h, big_w)
        (got,) = run_in_tract(report.path, [x.numpy(), skip.numpy()])
        want = model(x, skip).numpy()
        limit = 0.0 if mode.startswith("nearest") else 1e-5  # nearest: the same float32 indices as torch
        assert np.abs(got - want).max() <= limit, (h, w, big_h, big_w)

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


class TinyFPN(nn.Module):
    """A feature pyramid over any H×W: strided convs give levels of ``(H + 1)/2`` and ``(H + 3)/4``
    (floor forms, no multiples), the top-down path resizes each level to its lateral's shape
    (torchvision's ``size=feat.shape[-2:]``), heads upsample by a scale factor (smp's FPN) or with
    ``nn.Upsample`` (YOLO's neck), and one resizes to a fixed size."""

    def __init__(self) -> None:
        super().__init__()
        self.down = nn.ModuleList(nn.Conv2d(c, 4, 3, stride=2, padding=1) for c in (3, 4))
        self.lateral = nn.Conv2d(4, 4, 1)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        c2 = self.down[0](x)
        c4 = self.down[1](c2)
        p2 = self.lateral(c2) + F.interpolate(c4, size=c2.shape[-2:], mode="nearest")
        head = F.interpolate(c4, scale_factor=2, mode="bilinear", align_corners=False)
        pooled = F.interpolate(p2, size=(3, 5), mode="bilinear", align_corners=False)
        return p2, head, pooled, self.up(c4)


def test_fpn_resizes_over_symbolic_sizes_under_fx(tmp_path: Path) -> None:
    """FX lowers each ``F.interpolate`` (and ``nn.Upsample``, traced into) with the ATen rule over
    the levels' symbolic sizes; through torch.export (FX's route for calls it cannot see into)
    ``(H + 3)/4`` was refused as a Dim, and the lateral's size would be the capture's integers."""
    torch.manual_seed(0)
    model = TinyFPN().eval()
    report = torchlower.export(
        model, torch.randn(1, 3, 20, 28), tmp_path / "m.nnef.tgz", frontend="fx",
        dynamic_axes={"x": {2: "H", 3: "W"}},
    )  # fmt: skip
    assert report.frontend == "fx" and report.inputs[0].shape == (1, 3, "H", "W")
    assert [p.label for p in report.points if "=" in p.label and p.ok]  # the export's own size checks
    for h, w in ((13, 9), (31, 40), (7, 64)):  # odd and even: the floor forms differ from H/4
        x = torch.randn(1, 3, h, w)
        got = run_in_tract(report.path, [x.numpy()])
        with torch.no_grad():
            want = model(x)
        for g, t in zip(got, want, strict=True):
            assert g.shape == tuple(t.shape) and np.abs(g - t.numpy()).max() <= 1e-5, (h, w, g.shape)

"""Sizes that are a multiple of a floor, ``e·floor((u + r) / c) + d`` (issue 28, items 3 and 5).

EnCodec pads its input to a multiple of its stride (``4·ceil(T / 4)``); Parakeet's relative
positions have ``2·L - 1`` rows for L frames. Neither is a floor of the length itself, so the
fitter searches that form too when no plain floor fits; the archives are then run in tract far
from every capture. Clamps such as ``min(1, 2·L)`` that hold for every positive length are
decided when the size is built, since tract cannot equate sizes that still carry them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import sympy
import torch
from torch import nn
from torch.nn import functional as F

import torchlower
from torchlower.core.size_forms import scaled_forms
from torchlower.core.values import SymDim
from torchlower.nnef.tract import run_in_tract


class PadToMultiple(nn.Module):
    """Right-pad the time axis to a multiple of 4, then sum each group of 4 (EnCodec's padding)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        extra = (4 - x.shape[-1] % 4) % 4
        y = F.pad(x, (0, extra))
        return y.reshape(y.shape[0], y.shape[1], -1, 4).sum(-1) * y.shape[-1]


class RelativePositions(nn.Module):
    """Frames of a stride-8 conv and a table of their 2·L - 1 relative positions (Parakeet)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(2, 3, 3, stride=8, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        frames = y.shape[-1]
        positions = torch.arange(frames - 1, -frames, -1, dtype=y.dtype)
        shifted = F.pad(positions, (1, 0))[1:]  # a slice [1:] of a size >= 1: min(1, 2·L) is 1
        return torch.cat([y.flatten(), shifted / 10])


@pytest.mark.parametrize("frontend", ["jit", "fx"])
@pytest.mark.parametrize(("model", "shape"), [(PadToMultiple, (1, 2, 50)), (RelativePositions, (1, 2, 120))])
def test_scaled_floor_sizes_hold_far_from_the_captures(
    tmp_path: Path, frontend: str, model: type, shape: tuple[int, ...]
) -> None:
    torch.manual_seed(0)
    m = model().eval()
    report = torchlower.export(
        m, torch.randn(*shape), tmp_path / "m.nnef.tgz", frontend=frontend, dynamic_axes={"x": {2: "T"}}
    )
    assert report.max_abs_error < 1e-4
    for t in (1, 7, 333, 4097):
        x = torch.randn(*shape[:2], t)
        with torch.no_grad():
            want = m(x).numpy()
        (got,) = run_in_tract(report.path, [x.numpy()])
        assert got.shape == want.shape, (t, got.shape, want.shape)
        assert np.abs(got - want).max() <= 1e-4 * max(1.0, float(np.abs(want).max())), t


def test_scaled_forms_find_the_padding_and_only_forms_that_fit() -> None:
    t = np.array([4800, 4801, 4803, 2400, 4804, 9607])
    m = 4 * -(-t // 4) + 4  # EnCodec: pad to a multiple of 4, plus 4
    found, _ = scaled_forms(t, m)
    assert found, "the form is in the class"
    for (a, c, r, d), e, d0 in found:
        assert np.array_equal(e * ((a * t + r) // c + d) + d0, m)
    assert scaled_forms(t, t // 3)[0] == [], "a plain floor is not searched again here"


def test_clamps_that_hold_for_every_positive_size_are_decided() -> None:
    T = sympy.Symbol("T", integer=True, positive=True)
    frames = sympy.floor((T + 7) / 8)
    assert SymDim.wrap(sympy.Min(1, 2 * frames)) == 1
    assert SymDim.wrap(sympy.Max(0, frames)).expr == frames
    # these depend on T: kept for tract to evaluate
    assert isinstance(SymDim.wrap(sympy.Min(3, T)).expr, sympy.Min)
    assert isinstance(SymDim.wrap(sympy.Max(T - 3, 0)).expr, sympy.Max)
    assert isinstance(SymDim.wrap(sympy.Min(0, sympy.floor((T + 240) / 320) - 1)).expr, sympy.Min)

"""Layer norm centred as ``n·x - Σx`` (torchlower/nnef/norms.py): same numbers in tract, and the
pass stays away from the norms it is not measured or safe for.

Each case is exported with and without the pass; both artifacts run in tract on several inputs
(scales 1, 30, 1e-3 and a shifted one) and must agree with PyTorch and with each other.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import torchlower
from torchlower.nnef import norms
from torchlower.nnef.tract import run_points_in_tract


class Residual(nn.Module):
    """x + sin(x) → norm → linear: the norm reads a value that is also used elsewhere."""

    def __init__(self, norm: nn.Module, width: int) -> None:
        super().__init__()
        self.norm, self.out = norm, nn.Linear(width, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x + x.sin()
        return self.out(self.norm(h)) + h.mean()


CASES = {  # name: (norm, input shape, whether the pass fires)
    "layer-norm-64": (nn.LayerNorm(64), (2, 5, 64), True),  # n a power of two: bit-identical
    "layer-norm-48": (nn.LayerNorm(48, eps=1e-5), (1, 7, 48), True),
    "layer-norm-no-affine": (nn.LayerNorm(40, elementwise_affine=False), (3, 40), True),
    "group-norm": (nn.GroupNorm(2, 4), (1, 4, 6), True),  # normalised over one merged trailing axis
    "layer-norm-2-axes": (nn.LayerNorm((4, 16)), (2, 4, 16), False),
    "layer-norm-long-row": (nn.LayerNorm(norms.MAX_ROW + 4), (1, 2, norms.MAX_ROW + 4), False),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_centre_by_sum_matches(case, monkeypatch, tmp_path):
    norm, shape, fires = CASES[case]
    torch.manual_seed(0)
    model = Residual(norm, shape[-1]).eval()
    x = torch.randn(*shape)
    with monkeypatch.context() as m:
        m.setattr(norms, "centre_by_sum", lambda b: False)
        plain = torchlower.export(model, x, tmp_path / "plain.nnef.tar", check=False)
    new = torchlower.export(model, x, tmp_path / "new.nnef.tar")  # the export's own check passes too
    assert new.op_histogram["sum_reduce"] - plain.op_histogram["sum_reduce"] == (1 if fires else 0)
    rng = np.random.default_rng(16)
    points = [[(rng.standard_normal(shape, dtype=np.float32) * s + o).astype(np.float32)]
              for s, o in ((1.0, 0.0), (30.0, 0.0), (1e-3, 0.0), (1.0, 50.0))]  # fmt: skip
    a, b = run_points_in_tract(plain.path, points), run_points_in_tract(new.path, points)
    for (p,), (ya,), (yb,) in zip(points, a, b, strict=True):
        with torch.no_grad():
            want = model(torch.from_numpy(p)).numpy()
        scale = max(1.0, float(np.abs(want).max()))
        assert np.abs(yb - want).max() <= 2e-5 * scale
        assert np.abs(yb - ya).max() <= 2e-5 * scale
        if case == "layer-norm-64":  # n·x and Σx/n are exact scalings: the same floats
            # by construction on any CPU: both graphs run in this machine's tract, the row sums
            # are the same reduction over the same row (its mean is that sum over n), and
            # scaling by n = 2⁶ (and n² in eps, rsqrt) commutes with rounding
            assert np.array_equal(ya, yb)


def test_f16_export_is_left_alone(tmp_path):
    model = Residual(nn.LayerNorm(32), 32).eval()
    report = torchlower.export(model, torch.randn(2, 32), tmp_path / "h.nnef.tar", precision="f16")
    assert report.op_histogram["sum_reduce"] == 0

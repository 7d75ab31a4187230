"""NaN, ±inf and the far negative tail through the three front ends (issue 32, nnef/guards_values.py).

Each model is exported with its special-valued example (so the check compares it position by
position: NaN where torch has NaN) and then run in tract at the same input, compared with a
relative tolerance where the plain check's absolute one would hide a 4.5e-7 floor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

import torchlower

NAN, INF = float("nan"), float("inf")
ROW = [NAN, -INF, INF, -90.0, -40.0, -17.0, -12.0, -0.0, 0.0, 5.0, 1e-3, 3.0]


class Tails(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.sigmoid(x), nn.functional.silu(x), torch.log(torch.sigmoid(x)), torch.tanh(x)


class Extrema(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            x.amax(-1),
            x.amin(-1),
            x.max(-1).values,
            torch.clamp(x, -1.0, 1.0),
            torch.maximum(x, x.flip(-1)),
        )


def _exported(model: nn.Module, x: torch.Tensor, frontend: str, tmp_path: Path) -> list[np.ndarray]:
    path = tmp_path / "m.nnef.tgz"
    report = torchlower.export(model.eval(), x, path, frontend=frontend)
    assert all(e.ok for e in report.errors)
    return list(torchlower.load(path).run([x.numpy()]).values())


def _same(want: torch.Tensor, got: np.ndarray, rtol: float) -> None:
    w = want.numpy()
    assert np.array_equal(np.isnan(w), np.isnan(got)), (w, got)
    np.testing.assert_allclose(got[~np.isnan(w)], w[~np.isnan(w)], rtol=rtol, atol=0)


def test_sigmoid_family_tails_and_nan(frontend: str, tmp_path: Path) -> None:
    x = torch.tensor([ROW, [-30.0, -60.0, -80.0, -20.0, -1.0, 1.0, 20.0, 40.0, -5.0, -8.0, -3.0, NAN]])
    got = _exported(Tails(), x, frontend, tmp_path)
    want = Tails()(x)
    for w, g in zip(want[:3], got[:3], strict=True):
        finite = torch.isfinite(w) & (x > -87)  # torch's own kernel flushes sigmoid(-90) to 0
        _same(torch.where(finite | w.isnan(), w, torch.from_numpy(g)), g, rtol=2e-5)
    assert np.isnan(got[3][0, 0]) and np.isnan(got[3][1, -1])  # tanh(NaN): NaN, not -1
    np.testing.assert_allclose(got[3][~np.isnan(got[3])], want[3].numpy()[~np.isnan(got[3])], atol=1e-6)


def test_extrema_and_clamp_keep_nan(frontend: str, tmp_path: Path) -> None:
    x = torch.tensor([[1.0, NAN, 3.0, -2.0], [-INF, -INF, -INF, -INF], [0.5, -0.25, 2.0, INF], [NAN] * 4])
    got = _exported(Extrema(), x, frontend, tmp_path)
    for w, g in zip(Extrema()(x), got, strict=True):
        _same(w, g, rtol=0)

"""NaN, ±inf and the far negative tail through the three front ends (issue 32, nnef/guards_values.py).

Each model is exported with its special-valued example (so the check compares it position by
position: NaN where torch has NaN) and then run in tract at the same input, compared with a
relative tolerance where the plain check's absolute one would hide a 4.5e-7 floor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchlower
from torchlower.errors import CheckError, InvalidArgumentError

NAN, INF = float("nan"), float("inf")
ROW = [NAN, -INF, INF, -90.0, -40.0, -17.0, -12.0, -0.0, 0.0, 5.0, 1e-3, 3.0]


class Tails(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.sigmoid(x), nn.functional.silu(x), torch.log(torch.sigmoid(x)), torch.tanh(x)


class Extrema(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return x.amax(-1), x.amin(-1), x.max(-1).values


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


def test_extrema_keep_nan(frontend: str, tmp_path: Path) -> None:
    x = torch.tensor([[1.0, NAN, 3.0, -2.0], [-INF, -INF, -INF, -INF], [0.5, -0.25, 2.0, INF], [NAN] * 4])
    got = _exported(Extrema(), x, frontend, tmp_path)
    for w, g in zip(Extrema()(x), got, strict=True):
        _same(w, g, rtol=0)


class Cleaned(nn.Module):
    """Special inputs cleaned away: torch's outputs at the special-values point are all finite."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top = torch.nan_to_num(x.amax(-1), nan=5.0, posinf=6.0, neginf=-6.0)
        return top, torch.nan_to_num(torch.sigmoid(x) * 2.0 - torch.tanh(x), nan=0.5)


def test_special_values_point_counts_where_torch_is_finite(frontend: str, tmp_path: Path) -> None:
    x = torch.randn(3, 40)
    report = torchlower.export(Cleaned().eval(), x, tmp_path / "c.nnef.tgz", frontend=frontend)
    point = report.points[-1]
    assert point.label == "special values" and point.skipped is None and point.ok
    assert [e.name for e in point.errors] == ["output_0 (special values)", "output_1 (special values)"]


def test_special_values_point_finds_a_dropped_nan(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without the NaN guard on max_reduce, tract's amax skips the NaN: the default check lists
    the difference (never a ✓), the strict one refuses the archive."""
    from torchlower.nnef import guards_values

    monkeypatch.setattr(guards_values, "nan_extrema", lambda b: False)
    x = torch.randn(3, 40)
    report = torchlower.export(Cleaned().eval(), x, tmp_path / "c.nnef.tgz", frontend="jit")
    point = report.points[-1]
    assert not point.ok and "tract differs from PyTorch at special values (output_0" in (point.skipped or "")
    with pytest.raises(CheckError, match=r"output_0 \(special values\)"):
        torchlower.export(Cleaned().eval(), x, tmp_path / "s.nnef.tgz", frontend="jit", check="special")


class Gelu(nn.Module):
    """torch's float32 ``gelu(inf)`` is NaN, tract's inf (docs/reliability.md): not guarded."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(x) + 1.0


def test_special_values_by_default_skipped_where_nan_spreads_strict_refuses(tmp_path: Path) -> None:
    x = torch.randn(2, 24)
    report = torchlower.export(Gelu().eval(), x, tmp_path / "r.nnef.tgz", frontend="jit")
    assert report.points[-1].label == "special values"
    assert "check='special'" in (report.points[-1].skipped or "")
    # gelu(inf): torch NaN, tract inf: strict mode refuses it
    with pytest.raises(CheckError, match=r"special values"):
        torchlower.export(Gelu().eval(), x, tmp_path / "s.nnef.tgz", frontend="jit", check="special")
    x = torch.randn(2, 24)
    strict = torchlower.export(Tails().eval(), x, tmp_path / "t.nnef.tgz", frontend="jit", check="special")
    assert strict.points[-1].skipped is None and strict.points[-1].ok  # guarded ops: position by position


def test_check_option_is_validated(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="check must be True, False or 'special'"):
        torchlower.export(Gelu(), torch.randn(2, 3), tmp_path / "v.nnef.tgz", check="yes")


class Clamp(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.clamp(x, -1.0, 1.0), torch.maximum(x, x.flip(-1))


def test_clamp_of_nan_passes_the_strict_check(tmp_path: Path) -> None:
    """tract's clamp / maximum of NaN give the bound or the other operand; the rules keep the NaN
    (rules/nan.py), so the strict check compares the special point position by position and passes.
    The default check skips it (NaN in torch's outputs)."""
    x = torch.randn(2, 24)
    report = torchlower.export(Clamp().eval(), x, tmp_path / "c.nnef.tgz", frontend="jit")
    assert report.points[-1].skipped is not None
    strict = torchlower.export(Clamp().eval(), x, tmp_path / "s.nnef.tgz", frontend="jit", check="special")
    assert strict.points[-1].skipped is None and strict.points[-1].ok

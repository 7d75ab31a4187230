"""The check's float64 judge (issue 32): an ill-conditioned point is no false alarm, a wrong
archive still fails.

Where tract and torch-f32 disagree beyond tolerance at a point, the point is evaluated again in
float64 PyTorch (a deep copy of the model; the user's is untouched) and tract may be only as
far from float64 as torch-f32's own distance allows (``comparison.judge``, the fuzz judge's rule).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchlower
from tests.cli_models import Drifting
from torchlower.core.comparison import NOISE_FACTOR, OutputError, judge
from torchlower.errors import CheckError
from torchlower.pipeline import verification


def inverse3(m: torch.Tensor) -> torch.Tensor:
    """A 3×3 inverse by cofactors (what a homography warp computes by hand)."""
    a, b, c = m[..., 0, 0], m[..., 0, 1], m[..., 0, 2]
    d, e, f = m[..., 1, 0], m[..., 1, 1], m[..., 1, 2]
    g, h, i = m[..., 2, 0], m[..., 2, 1], m[..., 2, 2]
    co = [e * i - f * h, -(d * i - f * g), d * h - e * g]
    det = a * co[0] + b * co[1] + c * co[2]
    rows = [
        [co[0], -(b * i - c * h), b * f - c * e],
        [co[1], a * i - c * g, -(a * f - c * d)],
        [co[2], -(a * h - b * g), a * e - b * d],
    ]
    adj = torch.stack([torch.stack(r, -1) for r in rows], -2)
    return adj / det[..., None, None]


class Residual(nn.Module):
    """inv(m) @ m: the identity in exact arithmetic, float32 rounding × cond(m) in practice."""

    def forward(self, m: torch.Tensor) -> torch.Tensor:
        return inverse3(m) @ m


class Cancel(nn.Module):
    """A sum that cancels: (x + 1e4) summed over 16, minus 16e4 — float32 keeps ~3 digits."""

    def __init__(self, weighted: bool = False) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16) if weighted else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.lin(x) + 1e4).sum(-1) - 1e4 * x.shape[-1]


class Float32Step(nn.Module):
    """The same cancellation through a matmul with an explicit float32 constant: no float64 run."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ones = torch.ones(x.shape[-1], 1, dtype=torch.float32)
        return ((x + 1e4) @ ones).squeeze(-1) - 1e4 * x.shape[-1]


def near_singular(n: int = 64, gap: float = 1e-5) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    m = torch.randn(n, 3, 3, generator=g)
    m[:, 2] = m[:, 0] + m[:, 1] + gap * torch.randn(n, 3, generator=g)
    return m


@pytest.mark.parametrize("frontend", ["jit", "export"])
def test_near_singular_inverse_is_no_false_alarm(frontend: str, tmp_path: Path) -> None:
    model, m = Residual().eval(), near_singular()
    state = {k: v.clone() for k, v in model.state_dict().items()}
    report = torchlower.export(model, m, tmp_path / "r.nnef.tgz", frontend=frontend)
    first = report.points[0].errors[0]
    assert first.max_abs > first.tolerance, "example no longer ill-conditioned"
    assert first.ok and first.note is not None and first.note.startswith("ill-conditioned here")
    assert first.float32_off is not None and first.float32_off > first.tolerance  # torch-f32 is off too
    assert first.vs_float64 is not None and first.vs_float64 <= first.allowance
    assert all(p.ok for p in report.points if p.skipped is None)
    assert all(e.note is None for p in report.points[1:] for e in p.errors)  # random: well-conditioned
    assert all(v.dtype == torch.float32 for v in model.state_dict().values())
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_cancellation_at_every_random_point_is_judged_in_float64(tmp_path: Path) -> None:
    model, x = Cancel().eval(), torch.randn(8, 16)
    report = torchlower.export(model, x, tmp_path / "c.nnef.tgz", frontend="jit")
    judged = [e for p in report.points for e in p.errors if e.max_abs > e.tolerance]
    assert len(judged) >= 3, "tract and torch-f32 no longer differ here: the test proves nothing"
    assert all(e.ok and "torch-f32 itself is off by" in (e.note or "") for e in judged)


def test_tampered_weight_still_fails_both_ways(tmp_path: Path) -> None:
    model, x = Cancel(weighted=True).eval(), torch.randn(8, 16)
    path = tmp_path / "w.nnef"
    report = torchlower.export(model, x, path, frontend="jit")
    assert any(e.note for e in report.errors), "no point was ill-conditioned: the test proves nothing"
    assert torchlower.check(path, [x.numpy()], model=model).ok  # the same verdict from check
    dat = path / "lin.weight.dat"
    data = bytearray(dat.read_bytes())
    values = np.frombuffer(bytes(data[128:]), dtype="<f4").copy()
    values[5] += 0.5  # one weight off by 0.5: moves the sums ~10× more than float32 rounding does
    data[128:] = values.tobytes()
    dat.write_bytes(bytes(data))
    with pytest.raises(CheckError, match="not float32 rounding") as caught:
        torchlower.check(path, [x.numpy()], model=model)
    assert all(not e.ok and e.vs_float64 is not None for e in caught.value.errors)


def test_a_model_that_cannot_run_in_float64_says_so(tmp_path: Path) -> None:
    with pytest.raises(CheckError, match="float64 PyTorch cannot run the model") as caught:
        torchlower.export(Float32Step().eval(), torch.randn(8, 16), tmp_path / "f.nnef.tgz", frontend="jit")
    assert all(e.vs_float64 is None for e in caught.value.errors)


def test_judge_never_passes_tract_further_off_than_torch() -> None:
    exact = np.array([1.0e4, 1.0], dtype=np.float64)
    want = np.array([1.0e4 + 2.0, 1.0], dtype=np.float32)  # torch-f32 off by 2
    plain = OutputError("y", 50.0, 0.0, 1e-3)  # off torch-f32 beyond tolerance
    near = judge(plain, want, exact, np.array([1.0e4 - 3.0, 1.0], dtype=np.float32))
    assert near.ok and near.float32_off == 2.0 and near.vs_float64 == 3.0
    far = judge(plain, want, exact, np.array([1.0e4 + 2.0 + 1e-3 + NOISE_FACTOR * 2.0 + 1.0, 1.0]))
    assert not far.ok and "not float32 rounding" in (far.note or "")
    calm = judge(plain, np.array([2.0, 1.0], np.float32), np.array([2.0, 1.0]), np.array([2.01, 1.0]))
    assert not calm.ok  # well-conditioned: no allowance at all
    nan = judge(plain, want, exact, np.array([np.nan, 1.0], dtype=np.float32))
    assert not nan.ok


class Inverse(nn.Module):
    def forward(self, m: torch.Tensor) -> torch.Tensor:
        return torch.linalg.inv(m)


class Inverse3(nn.Module):
    def forward(self, m: torch.Tensor) -> torch.Tensor:
        return inverse3(m)


def test_models_that_invert_get_well_conditioned_random_points(tmp_path: Path) -> None:
    """An archive of the cofactor inverse checked against ``torch.linalg.inv``: the random
    points are diagonally dominant (condition number a few units) and labelled so."""
    m = torch.randn(16, 3, 3, generator=torch.Generator().manual_seed(3))
    path = tmp_path / "inv.nnef.tgz"
    plain = torchlower.export(Inverse3().eval(), m, path, frontend="jit")
    assert all("well-conditioned" not in p.label for p in plain.points)  # no inverting ATen op
    found = torchlower.check(path, [m.numpy()], model=Inverse())
    labels = [p.label for p in found.points]
    assert labels[0] == "given inputs" and labels[-1] == "special values" and len(labels) == 5
    assert all(label.endswith("well-conditioned for linalg_inv_ex)") for label in labels[1:4]), labels
    assert found.ok
    points = verification.random_points((m,), reference=lambda ins: [Inverse()(*ins)])
    conds = torch.linalg.cond(torch.stack([p.inputs[0] for p in points]).double())
    assert float(conds.max()) < 10, conds.max()
    loose = verification.random_points((m,))  # without the reference: drawn as before
    assert float(torch.linalg.cond(torch.stack([p.inputs[0] for p in loose]).double()).max()) > 10


def test_a_stateful_model_gets_no_float64_allowance(tmp_path: Path) -> None:
    with pytest.raises(CheckError, match="state or randomness") as caught:
        # not a function of its inputs: a float64 copy of it differs by far more than rounding
        torchlower.export(Drifting(), torch.randn(2, 3), tmp_path / "d.nnef.tgz", frontend="jit")
    assert all(not e.ok and e.vs_float64 is None for e in caught.value.errors)

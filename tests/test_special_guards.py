"""NaN, ±inf and -0.0 through the clamp family, arg-reductions, max pooling and casts (issue 32).

Each model runs in tract at an input holding the special values and must equal torch position
by position (NaN where torch has NaN, the same infinity, the sign of a zero where it shows
through ``1 / x``), through the three front ends. The lowerings are in ``rules/nan.py``, the
pool, cast and fused-clamp guards in ``nnef/guards_values.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import torchlower

NAN, INF = float("nan"), float("inf")
BIG, TINY, DENORMAL = 3.4028234663852886e38, 1.1754943508222875e-38, 1.401298464324817e-45
ROW = [NAN, INF, -INF, -0.0, 0.0, BIG, -BIG, TINY, -DENORMAL, -40.0, 0.25, 2.0]


def _run(model: nn.Module, xs: tuple[torch.Tensor, ...], frontend: str, tmp_path: Path) -> list[np.ndarray]:
    """Exported without the check (these inputs are the point), then run in tract."""
    path = tmp_path / "m.nnef.tgz"
    example = tuple(torch.randn(x.shape) if x.is_floating_point() else x for x in xs)
    torchlower.export(model.eval(), example, path, frontend=frontend, check=False)
    return list(torchlower.load(path).run([x.numpy() for x in xs]).values())


def _equal(model: nn.Module, xs: tuple[torch.Tensor, ...], frontend: str, tmp_path: Path) -> None:
    got = _run(model, xs, frontend, tmp_path)
    with torch.no_grad():
        want = model(*xs)
    for k, (w, g) in enumerate(zip(want if isinstance(want, tuple) else (want,), got, strict=True)):
        w = w.numpy()
        assert w.dtype == g.dtype and w.shape == g.shape, (k, w.dtype, g.dtype)
        if w.dtype.kind == "f":  # the sign of zeros too: 1 / -0.0 is -inf
            np.testing.assert_array_equal(np.signbit(w[w == 0]), np.signbit(g[w == 0]), err_msg=f"output {k}")
            np.testing.assert_allclose(g, w, rtol=2e-6, atol=0, err_msg=f"output {k}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"output {k}")


class Clamps(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (
            torch.relu(x), torch.clamp(x, -1.0, 1.0), torch.clamp_min(x, 0.5), torch.clamp_max(x, 0.0),
            F.hardtanh(x), F.relu6(x), F.hardsigmoid(x), torch.max(x, x.flip(-1)), torch.min(x, x.flip(-1)),
            torch.clamp(x, min=x.flip(-1)),
        )  # fmt: skip


def test_clamp_family_keeps_nan_and_negative_zero(frontend: str, tmp_path: Path) -> None:
    _equal(Clamps(), (torch.tensor([ROW]),), frontend, tmp_path)


class SignedZeroBounds(nn.Module):
    """A ``-0.0`` bound beside ``0.0`` literals: tract merged the two constants (``-0.0 == 0.0``),
    so ``clamp_min(sign(x), 0.0)`` gave -0.0 for negative x and ``1 // that`` -inf (the fuzz's
    case)."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        lifted = torch.clamp_min(torch.sign(x), 0.0)
        return torch.clamp_max(x, -0.0), torch.clamp_min(x, -0.0), 1 // lifted, torch.clamp(x, -0.0, 0.0)


def test_a_negative_zero_bound_beside_a_zero_literal(frontend: str, tmp_path: Path) -> None:
    _equal(SignedZeroBounds(), (torch.tensor([ROW]),), frontend, tmp_path)


class Args(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        m = x.reshape(3, 4)
        return m.argmax(-1), m.argmin(-1), m.max(-1).indices, m.min(0).indices, x.argmax(), m.argmax(1, True)


def test_arg_reductions_give_the_first_nan(frontend: str, tmp_path: Path) -> None:
    x = torch.tensor([[1.0, NAN, 3.0, NAN, -INF, -INF, -INF, -INF, 0.5, INF, -2.0, 7.0]])
    _equal(Args(), (x,), frontend, tmp_path)


class Pools(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.max_pool1d(x, 2), F.max_pool2d(x.reshape(1, 3, 2, 4), 2, stride=1, padding=1)


def test_max_pool_windows_of_nan_and_of_only_minus_inf(frontend: str, tmp_path: Path) -> None:
    x = torch.tensor([[[NAN, 1.0, -INF, -INF, INF, NAN, -0.0, -1.0], [NAN] * 2 + [-INF] * 6, ROW[:8]]])
    _equal(Pools(), (x,), frontend, tmp_path)


class Casts(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x * 1e10
        return x.to(torch.int64), x.to(torch.int32), y.to(torch.uint8), y.to(torch.int16), x.to(torch.uint8)


def test_float_to_integer_casts_as_torch(frontend: str, tmp_path: Path) -> None:
    x = torch.tensor([NAN, INF, -INF, BIG, -BIG, 3e9, -3e9, 1e19, 300.7, -1.5, -129.0, 40000.0])
    _equal(Casts(), (x,), frontend, tmp_path)


class Tails(nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.log1p(x), F.softplus(x), F.logsigmoid(x), torch.atan2(y, x)


def test_log1p_softplus_log_sigmoid_atan2_at_the_extremes(frontend: str, tmp_path: Path) -> None:
    x = torch.tensor([NAN, INF, -INF, -0.0, 0.0, BIG, -BIG, TINY, -DENORMAL, DENORMAL, -40.0, -100.0, 1e-8])
    y = torch.tensor([0.0, 1.0, 1.0, -0.0, -0.0, 1.0, 0.0, 0.0, 0.0, -0.0, 0.0, 1.0, 0.0])
    got = _run(Tails(), (x, y), frontend, tmp_path)
    for w, g in zip(Tails()(x, y), got, strict=True):
        w = w.numpy()
        assert np.array_equal(np.isnan(w), np.isnan(g)), (w, g)
        # log1p(BIG) is 1 ulp off; torch's log1p(denormal) is 0 where tract keeps the denormal
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-44)
        zeros = (w == 0) & (g == 0)
        np.testing.assert_array_equal(np.signbit(w[zeros]), np.signbit(g[zeros]))


class ConvRelu(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(1, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool1d(torch.relu(self.conv(x)), 2)


def test_relu_after_a_conv_and_its_pool_stay_tracts_fused_ops(tmp_path: Path) -> None:
    """Speed over NaN (guards_values.fused_clamps, nan_pools): the ReLU of a conv is tract's relu,
    the pool of that ReLU has no NaN guard; a ReLU of anything else keeps the NaN."""
    report = torchlower.export(
        ConvRelu().eval(), torch.randn(1, 1, 8), tmp_path / "c.nnef.tgz", frontend="jit"
    )
    assert report.op_histogram["relu"] == 1 and report.op_histogram["max_pool"] == 1
    assert "select" not in report.op_histogram and "tract_core_is_nan" not in report.op_histogram


class DenormalWeights(nn.Module):
    """A matmul and a conv whose constant weights hold denormals (nnef/guards_matmul.normal_weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.tensor([[DENORMAL, 1.0], [2.0, -DENORMAL]])
        self.conv = nn.Conv1d(2, 2, 1, bias=False)
        with torch.no_grad():
            self.conv.weight.copy_(self.w[:, :, None])

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return F.silu(x @ self.w), self.conv(x.t()[None])


def test_denormal_weights_times_infinity(frontend: str, tmp_path: Path) -> None:
    """tract's matmul/conv kernels flush denormal operands: inf · 1e-45 in a dot product was NaN."""
    x = torch.tensor([[INF, 1.0], [-INF, 2.0], [1.0, 3.0]])
    _equal(DenormalWeights(), (x,), frontend, tmp_path)

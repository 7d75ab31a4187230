"""``torchlower::linear_scan`` (the recurrence of Mamba layers) through every front end, in tract."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.test_dynamic import export_dynamic
from torchlower.core.scan_ops import delta_scan_op, linear_scan_op


class Mamba1Scan(nn.Module):
    """The shapes of Mamba's selective scan: a per-channel, per-state decay and a shared read-out."""

    def forward(self, dt: torch.Tensor, x: torch.Tensor, bc: torch.Tensor, h0: torch.Tensor) -> object:
        a = torch.exp(-dt[..., None] * torch.arange(1.0, 5.0))  # [B, S, D, N]
        u = (dt * x)[..., None] * bc[:, :, None, :4]
        y, h = linear_scan_op(a, u, bc[:, :, None, 4:], h0)
        return y * 2.0, h


class Mamba2Scan(nn.Module):
    """Mamba2's: one decay per head, [B, S, H, P, N] state, read-out shared across P."""

    def forward(self, a: torch.Tensor, u: torch.Tensor, c: torch.Tensor, h0: torch.Tensor) -> object:
        return linear_scan_op(torch.sigmoid(a)[..., None, None], u, c[:, :, :, None, :], h0)


class DeltaRule(nn.Module):
    """Qwen3-Next's gated delta rule: per-head decay and β, a [B, S, H, Dk, Dv] memory."""

    def forward(
        self, g: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, h0: torch.Tensor
    ) -> object:
        decay = torch.exp(-torch.nn.functional.softplus(g))[..., None, None]
        beta = torch.sigmoid(g)[..., None, None]
        k = k * torch.rsqrt((k * k).sum(-1, keepdim=True) + 1e-6)  # HF's l2norm
        return delta_scan_op(decay, beta, q[..., None], k[..., None], v[..., None, :], h0)


def test_eager_matches_the_recurrence():
    a, u, c, h0 = (
        torch.rand(1, 5, 3, 4),
        torch.randn(1, 5, 3, 4),
        torch.randn(1, 5, 1, 4),
        torch.randn(1, 3, 4),
    )
    y, h = linear_scan_op(a, u, c, h0)
    state = h0
    for t in range(5):
        state = a[:, t] * state + u[:, t]
        assert torch.allclose(y[:, t], state @ c[0, t, 0])
    assert torch.equal(h, state)


@pytest.mark.parametrize("frontend", ["jit", "fx", "export"])
def test_mamba1_shapes_any_length(tmp_path, frontend):
    args = (torch.rand(2, 7, 3), torch.randn(2, 7, 3), torch.randn(2, 7, 8), torch.randn(2, 3, 4))
    axes = {"dt": {1: "S"}, "x": {1: "S"}, "bc": {1: "S"}}
    errors = export_dynamic(Mamba1Scan(), args, tmp_path, frontend, axes)
    assert set(errors) == {(1,), (4,), (9,)}


@pytest.mark.parametrize("frontend", ["jit", "fx", "export"])
def test_mamba2_shapes_any_length(tmp_path, frontend):
    args = (
        torch.randn(1, 6, 2),
        torch.randn(1, 6, 2, 3, 4),
        torch.randn(1, 6, 2, 4),
        torch.randn(1, 2, 3, 4),
    )
    axes = {"a": {1: "S"}, "u": {1: "S"}, "c": {1: "S"}}
    errors = export_dynamic(Mamba2Scan(), args, tmp_path, frontend, axes)
    assert set(errors) == {(1,), (4,), (9,)}


@pytest.mark.parametrize("frontend", ["jit", "fx", "export"])
def test_delta_rule_any_length(tmp_path, frontend):
    args = (torch.randn(1, 5, 2), torch.randn(1, 5, 2, 4), torch.randn(1, 5, 2, 4), torch.randn(1, 5, 2, 3),
            torch.randn(1, 2, 4, 3))  # fmt: skip
    axes = {n: {1: "S"} for n in ("g", "q", "k", "v")}
    errors = export_dynamic(DeltaRule(), args, tmp_path, frontend, axes)
    assert set(errors) == {(1,), (4,), (9,)}


def test_khronos_only_unrolls_the_static_length(tmp_path):
    """Without tract's loop the steps are unrolled: plain NNEF ops, the same numbers."""
    from torchlower.nnef import archive
    from torchlower.nnef.builder import NNEFBuilder
    from torchlower.pipeline.export import verify
    from torchlower.rules import NNEF_RULES

    inputs = [torch.rand(1, 3, 2, 4), torch.randn(1, 3, 2, 4), torch.randn(1, 3, 1, 4), torch.randn(1, 2, 4)]
    expected = list(linear_scan_op(*inputs))
    b = NNEFBuilder(tract=False)
    values = [b.add_input(f"in{i}", t.dtype, tuple(t.shape)) for i, t in enumerate(inputs)]
    outs = NNEF_RULES.lookup_function("torchlower::linear_scan").fn(b, *values)
    b.set_outputs(["y", "h"], list(outs))
    text = b.graph_text()
    assert "tract_core_scan" not in text and text.count("sum_reduce") == 3
    path = archive.write(tmp_path / "k.nnef.tgz", text, b.live_weights())
    assert all(e.ok for e in verify(path, inputs, expected, ["y", "h"]))

"""``torchlower::linear_scan``: the diagonal linear recurrence of state-space layers as one torch op.

``h_t = a_t · h_{t-1} + u_t`` and ``y_t = Σ_n h_t[…, n] · c_t[…, n]``, time on axis 1. HF's slow
Mamba path writes it as a Python loop over the tokens, which torch.export unrolls and so fixes
the sequence length; as one opaque op (its fake kernel gives symbolic shapes) every front end
sees a single call, which ``rules/ssm_scan.py`` lowers. Defined here, below the rules, so the
LLM wrappers that call it need not import them.
"""

from __future__ import annotations

import torch
from torch import Tensor


@torch.library.custom_op("torchlower::linear_scan", mutates_args=())
def linear_scan_op(a: Tensor, u: Tensor, c: Tensor, h0: Tensor) -> tuple[Tensor, Tensor]:
    """Eager: the loop HF's slow path runs. ``a``, ``u``, ``c`` [B, S, …] have the state's rank
    + 1 and broadcast to [B, S, *H] (size-1 axes where shared); ``h0`` [B, *H]. Returns
    y [B, S, *H[:-1]] and the last state [B, *H]."""
    h = h0
    ys = []
    for t in range(u.shape[1]):
        h = a[:, t] * h + u[:, t]
        ys.append((h * c[:, t]).sum(-1))
    return torch.stack(ys, 1), h.clone()


@linear_scan_op.register_fake
def _(a: Tensor, u: Tensor, c: Tensor, h0: Tensor) -> tuple[Tensor, Tensor]:
    batch, length = u.shape[0], u.shape[1]
    return h0.new_empty((batch, length, *h0.shape[1:-1])), h0.new_empty(h0.shape)


@torch.library.custom_op("torchlower::delta_scan", mutates_args=())
def delta_scan_op(
    decay: Tensor, beta: Tensor, q: Tensor, k: Tensor, v: Tensor, h0: Tensor
) -> tuple[Tensor, Tensor]:
    """The gated delta rule (Qwen3-Next's linear attention), time on axis 1, as HF's
    ``torch_recurrent_gated_delta_rule`` loops it: per step ``h = h·decay``, ``h += k ⊗ β(v − hᵀk)``,
    ``o = hᵀq``. ``decay``, ``beta`` [B, S, H, 1, 1], ``q``, ``k`` [B, S, H, Dk, 1], ``v`` [B, S, H, 1, Dv],
    ``h0`` [B, H, Dk, Dv]. Returns o [B, S, H, Dv] and the last state."""
    h = h0
    outs = []
    for t in range(v.shape[1]):
        h = h * decay[:, t]
        delta = (v[:, t] - (h * k[:, t]).sum(-2, keepdim=True)) * beta[:, t]
        h = h + k[:, t] * delta
        outs.append((h * q[:, t]).sum(-2))
    return torch.stack(outs, 1), h.clone()


@delta_scan_op.register_fake
def _(decay: Tensor, beta: Tensor, q: Tensor, k: Tensor, v: Tensor, h0: Tensor) -> tuple[Tensor, Tensor]:
    batch, length = v.shape[0], v.shape[1]
    return h0.new_empty((batch, length, h0.shape[1], h0.shape[3])), h0.new_empty(h0.shape)

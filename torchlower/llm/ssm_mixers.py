"""State-space mixers written once for every S, from and to explicit states.

HF's slow paths branch on the cache (a prefill pads the convolution and scans from zero, a
one-token decode takes the update kernels) and loop over the tokens in Python. Each function
here is the same arithmetic in HF's order for any S ≥ 1 tokens from any state: the causal
depthwise convolution runs over the state's K columns then the S new ones (its new state is the
last K), and the recurrence is ``torchlower::linear_scan``. ``ssm.StatefulCausalLM`` puts them
in place of the mixers' ``forward`` while it traces.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from torchlower.core.scan_ops import delta_scan_op, linear_scan_op
from torchlower.errors import LoweringError

Mixed = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # output, new conv state, new ssm state


def _convolved(
    m: nn.Module, x: torch.Tensor, conv_state: torch.Tensor, act: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The activated causal conv of ``x`` [B, C, S] after the state [B, C, K]: ([B, S, C], new state).

    Written as K shifted slices times their taps rather than a grouped ``conv1d``: tract 0.23.9
    runs a depthwise conv over a symbolic length as im2col + one matmul per group, ~1 ms per
    Mamba layer of 512 channels at S = 1 (84 % of a 4-layer decode step); the sum is ~20 µs."""
    kernel, length = conv_state.shape[-1], x.shape[-1]
    full = torch.cat([conv_state.to(x.dtype), x], dim=-1)  # [B, C, K + S]
    taps = m.conv1d.weight[:, 0, :]  # [C, K]
    out = sum(taps[:, j, None] * full.narrow(-1, 1 + j, length) for j in range(kernel))
    if m.conv1d.bias is not None:
        out = out + m.conv1d.bias[:, None]
    return act(out).transpose(1, 2), full[:, :, -kernel:]


def mamba_mixer(
    m: nn.Module, hidden: torch.Tensor, conv_state: torch.Tensor, ssm_state: torch.Tensor
) -> Mixed:
    """``MambaMixer``: HF's ``mamba_selective_scan`` / ``mamba_selective_state_update``, state [B, D, N]."""
    return _selective(m, hidden, conv_state, ssm_state, normed=False)


def jamba_mixer(
    m: nn.Module, hidden: torch.Tensor, conv_state: torch.Tensor, ssm_state: torch.Tensor
) -> Mixed:
    """``JambaMambaMixer``: Mamba's, with RMS norms on the time step, B and C after ``x_proj``."""
    return _selective(m, hidden, conv_state, ssm_state, normed=True)


def _selective(
    m: nn.Module, hidden: torch.Tensor, conv_state: torch.Tensor, ssm_state: torch.Tensor, normed: bool
) -> Mixed:
    x, gate = m.in_proj(hidden).transpose(1, 2).chunk(2, dim=1)
    x, conv = _convolved(m, x, conv_state, m.act)  # [B, S, D]
    rank, size = m.time_step_rank, m.ssm_state_size
    step, b, c = torch.split(m.x_proj(x), [rank, size, size], dim=-1)
    if normed:
        step, b, c = m.dt_layernorm(step), m.b_layernorm(b), m.c_layernorm(c)
    dt = F.softplus(m.dt_proj(step))  # [B, S, D]
    a_neg = -torch.exp(m.A_log.float())  # [D, N]
    decay = torch.exp(dt[..., None] * a_neg)  # [B, S, D, N]
    inflow = dt[..., None] * b[:, :, None, :] * x[..., None]
    y, state = linear_scan_op(decay, inflow, c[:, :, None, :], ssm_state.to(decay.dtype))
    y = (y + x * m.D) * F.silu(gate.transpose(1, 2))
    return m.out_proj(y.to(hidden.dtype)), conv, state


def mamba2_mixer(
    m: nn.Module, hidden: torch.Tensor, conv_state: torch.Tensor, ssm_state: torch.Tensor
) -> Mixed:
    """``Mamba2Mixer`` and Bamba's, state [B, H, P, N]: HF's chunked prefill (``mamba2_chunk_scan``:
    segment sums within chunks, a recurrence across them) and its one-step decode compute this
    one recurrence."""
    return _mamba2(m, m.in_proj(hidden), hidden.dtype, conv_state, ssm_state, normed=True)


def falcon_h1_mixer(
    m: nn.Module, hidden: torch.Tensor, conv_state: torch.Tensor, ssm_state: torch.Tensor
) -> Mixed:
    """``FalconH1Mixer``: Mamba2's, with µP multipliers on its input (``ssm_in_multiplier``) and on
    each section of its projection (``mup_vector``: z, x, B, C, dt), and the gated RMS norm
    optional (``mamba_rms_norm``; without it the output is gated as ``y · silu(z)``)."""
    projected = m.in_proj(hidden * m.ssm_in_multiplier) * m.mup_vector
    return _mamba2(m, projected, hidden.dtype, conv_state, ssm_state, normed=bool(m.mamba_rms_norm))


def _mamba2(
    m: nn.Module, projected: torch.Tensor, dtype: torch.dtype, conv_state: torch.Tensor,
    ssm_state: torch.Tensor, normed: bool,
) -> Mixed:  # fmt: skip
    """Mamba2's mixer after its input projection ``projected`` [B, S, z + xBC + dt]."""
    batch, length = projected.shape[0], projected.shape[1]
    heads, head_dim, groups, size = m.num_heads, m.head_dim, m.n_groups, m.ssm_state_size
    gate, xbc, dt = projected.split([m.intermediate_size, m.conv_dim, heads], dim=-1)
    xbc, conv = _convolved(m, xbc.transpose(1, 2), conv_state, m.act)
    x, b, c = torch.split(xbc, [m.intermediate_size, groups * size, groups * size], dim=-1)
    dt = F.softplus(dt + m.dt_bias)  # [B, S, H]
    low, high = m.time_step_limit
    if (low, high) != (0.0, float("inf")):  # HF's chunked prefill clamps (its decode does not)
        dt = torch.clamp(dt, low, high)
    decay = torch.exp(dt * -torch.exp(m.A_log.float()))[..., None, None]  # [B, S, H, 1, 1]
    x = x.reshape(batch, length, heads, head_dim)
    b = b.reshape(batch, length, groups, size).repeat_interleave(heads // groups, dim=2)
    c = c.reshape(batch, length, groups, size).repeat_interleave(heads // groups, dim=2)
    inflow = (x * dt[..., None])[..., None] * b[:, :, :, None, :]  # [B, S, H, P, N]
    y, state = linear_scan_op(decay, inflow, c[:, :, :, None, :], ssm_state.to(decay.dtype))
    y = (y + x * m.D[:, None]).reshape(batch, length, heads * head_dim)
    y = m.norm(y, gate) if normed else y * F.silu(gate)
    return m.out_proj(y.to(dtype)), conv, state


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    """HF's ``l2norm`` (FLA's): ``x / sqrt(Σx² + 1e-6)`` over the last axis."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + 1e-6)


def gated_delta_mixer(
    m: nn.Module, hidden: torch.Tensor, conv_state: torch.Tensor, ssm_state: torch.Tensor
) -> Mixed:
    """``Qwen3NextGatedDeltaNet``, state [B, value heads, Dk, Dv]: HF's chunked prefill
    (``torch_chunk_gated_delta_rule``) and its recurrent decode compute this one gated delta rule,
    here ``torchlower::delta_scan`` after HF's recurrent preparation (grouped q/k heads
    repeated, both L2-normalized in f32, q scaled by 1/√Dk)."""
    if m.activation not in ("silu", "swish"):
        raise LoweringError(
            f"{type(m).__name__}: conv activation {m.activation!r} is not supported (silu is)"
        )
    batch, length = hidden.shape[0], hidden.shape[1]
    q, k, v, z, b, a = m.fix_query_key_value_ordering(m.in_proj_qkvz(hidden), m.in_proj_ba(hidden))
    mixed = torch.cat([t.reshape(batch, length, -1) for t in (q, k, v)], dim=-1)
    mixed, conv = _convolved(m, mixed.transpose(1, 2), conv_state, F.silu)
    q, k, v = torch.split(mixed, [m.key_dim, m.key_dim, m.value_dim], dim=-1)
    q = q.reshape(batch, length, -1, m.head_k_dim)
    k = k.reshape(batch, length, -1, m.head_k_dim)
    v = v.reshape(batch, length, -1, m.head_v_dim)
    beta = b.sigmoid()
    g = -m.A_log.float().exp() * F.softplus(a.float() + m.dt_bias)  # [B, S, Hv]
    repeat = m.num_v_heads // m.num_k_heads
    if repeat > 1:
        q, k = q.repeat_interleave(repeat, dim=2), k.repeat_interleave(repeat, dim=2)
    q, k = _l2norm(q.float()), _l2norm(k.float())
    q = q / (q.shape[-1] ** 0.5)
    decay, beta = g.exp()[..., None, None], beta.float()[..., None, None]
    out, state = delta_scan_op(
        decay, beta, q[..., None], k[..., None], v.float()[..., None, :], ssm_state.float()
    )
    out = m.norm(out.to(hidden.dtype), z).reshape(batch, length, -1)
    return m.out_proj(out), conv, state


MIXERS: dict[str, Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], Mixed]] = {
    "MambaMixer": mamba_mixer,
    "JambaMambaMixer": jamba_mixer,
    "Mamba2Mixer": mamba2_mixer,
    "BambaMixer": mamba2_mixer,
    "FalconH1Mixer": falcon_h1_mixer,
    "Qwen3NextGatedDeltaNet": gated_delta_mixer,
}

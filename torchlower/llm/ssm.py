"""State-space causal LMs (Mamba): the model as ``(input_ids, *states) -> (logits, *new_states)``.

A Mamba layer carries two fixed-size states between calls instead of a growing KV cache: the
last ``conv_kernel`` inputs of its causal depthwise convolution (``conv``, [1, channels, K]) and
the SSM state (``ssm``, [1, channels, state_size]). tract's ``detect_kv_cache`` only turns
``input → concat along a growing axis → output`` into state, so these are explicit graph I/O:
``in_conv_state_{i}`` / ``in_ssm_state_{i}`` → ``out_conv_state_{i}`` / ``out_ssm_state_{i}``,
zeros before the first call. One graph takes any S ≥ 1 tokens from any state (prefill, decode,
a continuation).

HF's slow path branches on the cache (prefill pads the convolution, decode takes the one-token
update) and loops over the tokens in Python; the mixer's forward is replaced during the trace by
the same arithmetic written once for every S (``mamba_mixer``): the convolution runs over the
state's K columns then the S new ones, and the recurrence is ``torchlower::linear_scan``.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from torchlower.core.scan_ops import linear_scan_op

STATE_KINDS = ("conv", "ssm")


@dataclass(frozen=True)
class StateLayout:
    """The fixed-size states of every state-space layer, read from a real HF run."""

    layers: int
    shapes: tuple[tuple[int, ...], ...]  # per state, in input order: layer 0 conv, layer 0 ssm, …
    kinds: tuple[str, ...]
    indices: tuple[int, ...]  # the model layer each state belongs to

    def state_names(self, io: str) -> list[str]:
        return [f"{io}_{k}_state_{i}" for k, i in zip(self.kinds, self.indices, strict=True)]

    def input_names(self) -> list[str]:
        return ["input_ids", *self.state_names("in")]

    def output_names(self) -> list[str]:
        return ["outputs", *self.state_names("out")]

    def empty(self, past: int = 0, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
        """Zero states (``past`` is ignored: the states do not grow)."""
        return [torch.zeros(s, dtype=dtype) for s in self.shapes]

    def axes(self, context: int) -> dict[str, dict[int, tuple[str, int, int]]]:
        return {"input_ids": {1: ("S", 1, context)}}


def is_state_space(model: nn.Module) -> bool:
    return any(type(m).__name__ in MIXERS for m in model.modules())


def state_layout(model: nn.Module) -> StateLayout:
    """Layer by layer, the states HF's own cache holds after a 2-token prefill."""
    from torchlower.llm.wrapper import present_cache

    cache = present_cache(hf_forward(model, torch.zeros(1, 2, dtype=torch.long)))
    shapes, kinds, indices = [], [], []
    for i, layer in enumerate(cache.layers):
        for kind, states in (("conv", layer.conv_states), ("ssm", layer.recurrent_states)):
            shapes.append(tuple(states[0].shape))
            kinds.append(kind)
            indices.append(i)
    return StateLayout(len(cache.layers), tuple(shapes), tuple(kinds), tuple(indices))


def hf_forward(model: nn.Module, input_ids: torch.Tensor, past: Any = None) -> Any:
    """The model as HF's ``generate`` runs it: its own cache built from the config (per layer
    conv and recurrent states), prefill on the first call, the one-token update after."""
    from transformers.cache_utils import DynamicCache

    from torchlower.llm.wrapper import cache_arg

    cache = past if past is not None else DynamicCache(config=model.config)
    with torch.no_grad():
        return model(input_ids=input_ids, use_cache=True, **{cache_arg(model): cache})


def hf_states(cache: Any) -> list[torch.Tensor]:
    """Flat ``[conv0, ssm0, conv1, ssm1, …]`` of HF's cache, as the graph orders them."""
    out = []
    for layer in cache.layers:
        out += [layer.conv_states[0].detach().clone(), layer.recurrent_states[0].detach().clone()]
    return out


def mamba_mixer(
    m: nn.Module, hidden: torch.Tensor, conv_state: torch.Tensor, ssm_state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``MambaMixer`` on S tokens from its two states: (output, new conv state, new ssm state).

    The same operations as HF's ``causal_conv1d_fn``/``causal_conv1d_update`` and
    ``mamba_selective_scan``/``mamba_selective_state_update``, in their order."""
    kernel = conv_state.shape[-1]
    projected = m.in_proj(hidden).transpose(1, 2)
    x, gate = projected.chunk(2, dim=1)
    full = torch.cat([conv_state.to(x.dtype), x], dim=-1)  # [B, D, K + S]
    weight = m.conv1d.weight  # [D, 1, K]
    x = m.act(F.conv1d(full, weight, m.conv1d.bias, groups=weight.shape[0])[:, :, 1:])
    x = x.transpose(1, 2)  # [B, S, D]
    rank, size = m.time_step_rank, m.ssm_state_size
    step, b, c = torch.split(m.x_proj(x), [rank, size, size], dim=-1)
    dt = F.softplus(m.dt_proj(step))  # [B, S, D]
    a_neg = -torch.exp(m.A_log.float())  # [D, N]
    decay = torch.exp(dt[..., None] * a_neg)  # [B, S, D, N]
    inflow = dt[..., None] * b[:, :, None, :] * x[..., None]
    y, state = linear_scan_op(decay, inflow, c[:, :, None, :], ssm_state.to(decay.dtype))
    y = (y + x * m.D) * F.silu(gate.transpose(1, 2))
    return m.out_proj(y.to(hidden.dtype)), full[:, :, -kernel:], state


def mamba2_mixer(
    m: nn.Module, hidden: torch.Tensor, conv_state: torch.Tensor, ssm_state: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``Mamba2Mixer`` (and Bamba's) on S tokens from its two states, the state [B, H, P, N].

    HF runs a prefill through its chunked scan (``mamba2_chunk_scan``: segment sums within
    chunks, a recurrence across them) and a decode through the one-step update; both compute
    this recurrence, written here once as ``torchlower::linear_scan`` for every S."""
    batch, length = hidden.shape[0], hidden.shape[1]
    heads, head_dim, groups, size = m.num_heads, m.head_dim, m.n_groups, m.ssm_state_size
    kernel = conv_state.shape[-1]
    gate, xbc, dt = m.in_proj(hidden).split([m.intermediate_size, m.conv_dim, heads], dim=-1)
    full = torch.cat([conv_state.to(xbc.dtype), xbc.transpose(1, 2)], dim=-1)  # [B, conv_dim, K + S]
    weight = m.conv1d.weight
    xbc = m.act(F.conv1d(full, weight, m.conv1d.bias, groups=weight.shape[0])[:, :, 1:]).transpose(1, 2)
    x, b, c = torch.split(xbc, [m.intermediate_size, groups * size, groups * size], dim=-1)
    dt = F.softplus(dt + m.dt_bias)  # [B, S, H]
    low, high = m.time_step_limit
    if (low, high) != (0.0, float("inf")):  # HF's chunked prefill clamps (its decode does not)
        dt = torch.clamp(dt, low, high)
    a_neg = -torch.exp(m.A_log.float())  # [H]
    decay = torch.exp(dt * a_neg)[..., None, None]  # [B, S, H, 1, 1]
    x = x.reshape(batch, length, heads, head_dim)
    b = b.reshape(batch, length, groups, size).repeat_interleave(heads // groups, dim=2)
    c = c.reshape(batch, length, groups, size).repeat_interleave(heads // groups, dim=2)
    inflow = (x * dt[..., None])[..., None] * b[:, :, :, None, :]  # [B, S, H, P, N]
    y, state = linear_scan_op(decay, inflow, c[:, :, :, None, :], ssm_state.to(decay.dtype))
    y = (y + x * m.D[:, None]).reshape(batch, length, heads * head_dim)
    y = m.norm(y, gate)
    return m.out_proj(y.to(hidden.dtype)), full[:, :, -kernel:], state


MIXERS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = {
    "MambaMixer": mamba_mixer,
    "Mamba2Mixer": mamba2_mixer,
}


class StatefulCausalLM(nn.Module):
    """``forward(input_ids, *states)`` → ``(logits, *new_states)`` around a state-space LM."""

    def __init__(
        self,
        model: nn.Module,
        layout: StateLayout,
        logits: str = "last",
        state_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.model = model
        self.layout = layout
        self.last_only = logits == "last"
        self.state_dtype = state_dtype
        self.model_type = str(model.config.model_type)
        self.own_mask = True  # no attention mask: nothing for last_row to drop

    def forward(self, input_ids: torch.Tensor, *states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        feed = dict(enumerate(states))
        new: dict[int, torch.Tensor] = {}
        with _mixers_on(self.model, feed, new):
            out = self.model(input_ids=input_ids, use_cache=False, logits_to_keep=1 if self.last_only else 0)
        return (out.logits, *(new[i].to(self.state_dtype) for i in range(len(states))))


@contextmanager
def _mixers_on(
    model: nn.Module, feed: dict[int, torch.Tensor], new: dict[int, torch.Tensor]
) -> Iterator[None]:
    """Each mixer reads its states from ``feed`` and writes the new ones to ``new`` (restored after)."""
    patched = []
    position = 0
    for module in model.modules():
        fn = MIXERS.get(type(module).__name__)
        if fn is None:
            continue
        patched.append(module)
        module.forward = types.MethodType(_forward(fn, feed, new, position), module)  # type: ignore[method-assign]
        position += 2
    try:
        yield
    finally:
        for module in patched:
            del module.forward


def _forward(
    fn: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
    feed: dict[int, torch.Tensor],
    new: dict[int, torch.Tensor],
    at: int,
) -> Callable[..., torch.Tensor]:
    def forward(self: nn.Module, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out, new[at], new[at + 1] = fn(self, hidden_states, feed[at], feed[at + 1])
        return out

    return forward

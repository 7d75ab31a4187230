"""Mixture-of-experts layers traced densely: every expert on every token, weighted by the router.

transformers' expert modules (the ``@use_experts_implementation`` classes of Mixtral, Qwen2-MoE,
Qwen3-MoE, OLMoE, …) gather the tokens of each expert with ``nonzero`` / ``where`` on the
routing, a size that depends on the data, or sort them by expert along the token axis; neither
has a static graph. The sum they compute, ``Σ_k w_k · expert_{i_k}(x)``, is also
``Σ_e r_e · expert_e(x)`` with ``r_e`` the routing weight of expert ``e`` where the router
picked it and 0 elsewhere: every expert runs as one batched matmul over the expert axis, and the
router (softmax, top-k over the static expert axis) is traced as it is.

The price is ``experts / top_k`` times the expert FLOPs, and a decode step reads every expert's
weights (an exact sparse gather has no static form in NNEF). Memory stays bounded: unlike
transformers' ``batched_mm`` form, no weight matrix is copied per token.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn


@contextmanager
def dense_experts(model: nn.Module) -> Iterator[int]:
    """Inside, each expert collection of ``model`` runs densely; yields how many were patched."""
    patched: list[nn.Module] = []
    try:
        for module in model.modules():
            if _is_experts(module):
                module.forward = types.MethodType(_dense_forward, module)
                patched.append(module)
        yield len(patched)
    finally:
        for module in patched:
            del module.forward


def _is_experts(module: nn.Module) -> bool:
    """A module decorated by transformers' ``use_experts_implementation``, weights as 3-D tensors."""
    flags = ("has_gate", "has_bias", "is_transposed", "has_post_expert_norm", "num_experts")
    if not all(hasattr(module, f) for f in flags) or not hasattr(module, "_apply_gate"):
        return False
    up = getattr(module, "gate_up_proj" if module.has_gate else "up_proj", None)
    down = getattr(module, "down_proj", None)
    return isinstance(up, torch.Tensor) and isinstance(down, torch.Tensor) and up.dim() == down.dim() == 3


def _dense_forward(
    self: nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The experts' ``forward(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k])``."""
    experts = torch.arange(self.num_experts, device=hidden_states.device)
    picked = (top_k_index.unsqueeze(-1) == experts).to(top_k_weights.dtype)  # [T, k, E]
    routing = (picked * top_k_weights.unsqueeze(-1)).sum(1).transpose(0, 1).unsqueeze(-1)  # [E, T, 1]
    name = "gate_up_proj" if self.has_gate else "up_proj"
    out = _linear(self, hidden_states.unsqueeze(0), name)  # [E, T, 2F] or [E, T, F]
    out = self._apply_gate(out) if self.has_gate else self.act_fn(out)
    out = _linear(self, out, "down_proj")  # [E, T, H]
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    return (out * routing).sum(0).to(hidden_states.dtype)


def _linear(self: nn.Module, x: torch.Tensor, name: str) -> torch.Tensor:
    """``x @ W[e]ᵀ (+ b[e])`` for every expert ``e`` at once, ``W`` read as stored ([E, out, in],
    or transposed [E, in, out]): a transposed copy would be a new constant that Q4_0 cannot
    pack (``compress`` quantizes the weights a matmul reads as they are)."""
    weight = getattr(self, name)
    if self.is_transposed:
        y = x @ weight
    else:
        y = (weight @ x.transpose(-1, -2)).transpose(-1, -2)
    if self.has_bias:
        y = y + getattr(self, f"{name}_bias").unsqueeze(1)
    return y

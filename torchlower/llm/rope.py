"""Rotary embeddings traced as table lookups: ``cos``/``sin`` rows gathered by position.

transformers computes ``cos(position × inv_freq)`` and ``sin(…)`` on every forward. In tract
that is two transcendental passes over [S, head_dim] per step, ~10 % of a 128-token prefill
of a small Llama (measured with ``profile_json``; the reference exporter's graph pays it too).
The values only depend on the position, and positions are bounded by ``max_context``, so the
export computes them once, with the model's own module (scaling, partial rotary and
attention factors included: the table *is* what that module returns), and the graph gathers
row ``P + i``. The table is exactly torch's numbers, closer to the check's reference than
tract recomputing them. Tables larger than ``TABLE_LIMIT`` (very long contexts) are not
built: the module is traced as it is.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

TABLE_LIMIT = 16 << 20  # bytes of cos + sin tables, per rotary module
# frequencies fixed at construction; "dynamic" (rescaled by static_rope first) and "longrope"
# (short/long factors chosen by the current length) depend on more than the position
STATIC_TYPES = ("default", "linear", "llama3", "yarn")


@contextmanager
def rotary_tables(model: nn.Module, context: int) -> Iterator[int]:
    """Inside, each rotary module of ``model`` answers from a [context, dim] table; yields how many."""
    patched: list[nn.Module] = []
    try:
        for module in model.modules():
            if _table_able(module) and _install(module, context):
                patched.append(module)
        yield len(patched)
    finally:
        for module in patched:
            del module.forward
            for name in ("_torchlower_cos", "_torchlower_sin"):
                delattr(module, name)


def _table_able(module: nn.Module) -> bool:
    if not type(module).__name__.endswith("RotaryEmbedding") or not hasattr(module, "inv_freq"):
        return False
    if getattr(module, "rope_type", None) not in STATIC_TYPES:
        return False
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        return False
    return params == ["x", "position_ids"]


def _install(module: nn.Module, context: int) -> bool:
    """Build the tables with the module itself; keep them only if lookups reproduce it exactly."""
    inv_freq = module.inv_freq
    if 2 * context * 2 * inv_freq.numel() * 4 > TABLE_LIMIT:  # cos + sin, [context, 2 x freqs] f32
        return False
    probe = torch.zeros(1, 1, dtype=torch.float32, device=inv_freq.device)
    positions = torch.arange(context, device=inv_freq.device)[None]
    with torch.no_grad():
        cos, sin = module(probe, positions)
    if cos.dim() != 3 or cos.shape[:2] != (1, context) or sin.shape != cos.shape:
        return False
    module.register_buffer("_torchlower_cos", cos[0].contiguous(), persistent=False)
    module.register_buffer("_torchlower_sin", sin[0].contiguous(), persistent=False)
    original = type(module).forward

    def lookup(x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos = nn.functional.embedding(position_ids, module._torchlower_cos)
        sin = nn.functional.embedding(position_ids, module._torchlower_sin)
        return cos.to(x.dtype), sin.to(x.dtype)

    sample = torch.tensor([[0, context // 2, context - 1]], device=inv_freq.device)
    with torch.no_grad():
        want, got = original(module, probe, sample), lookup(probe, sample)
    if not all(torch.equal(w, g) for w, g in zip(want, got, strict=True)):
        for name in ("_torchlower_cos", "_torchlower_sin"):
            delattr(module, name)
        return False
    module.forward = lookup  # type: ignore[method-assign]
    return True

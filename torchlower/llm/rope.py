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

Longrope (Phi-3 128k) switches from its short to its long factors once the sequence is longer
than ``original_max_position_embeddings`` (``max(position_ids) + 1 > original``, a ``where``
in transformers, followed by an in-place update of the ``inv_freq`` buffer that would send
torch.export through a second, decomposing trace). It gets two tables and the same ``where``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

TABLE_LIMIT = 16 << 20  # bytes of cos + sin tables, per rotary module
# frequencies fixed at construction; "dynamic" (rescaled by static_rope first) depends on more
# than the position; "longrope" on the position and one length switch (two tables)
STATIC_TYPES = ("default", "linear", "llama3", "yarn", "longrope")


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
    switch = _switch(module, context)
    tables = 2 if switch is not None else 1
    if tables * 2 * context * 2 * inv_freq.numel() * 4 > TABLE_LIMIT:  # cos + sin, [context, 2 x freqs] f32
        return False
    probe = torch.zeros(1, 1, dtype=torch.float32, device=inv_freq.device)
    original = type(module).forward
    cos, sin = _table(module, probe, context, context)
    if cos is None:
        return False
    if switch is not None:
        short_cos, short_sin = _table(module, probe, switch, context)
        if short_cos is None:
            return False
        cos, sin = torch.cat([short_cos, cos]), torch.cat([short_sin, sin])
    module.register_buffer("_torchlower_cos", cos.contiguous(), persistent=False)
    module.register_buffer("_torchlower_sin", sin.contiguous(), persistent=False)

    def lookup(x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = position_ids
        if switch is not None:  # the long half of the tables once max(position) + 1 > switch
            rows = position_ids + (position_ids.max() + 1 > switch).to(position_ids.dtype) * context
        cos = nn.functional.embedding(rows, module._torchlower_cos)
        sin = nn.functional.embedding(rows, module._torchlower_sin)
        return cos.to(x.dtype), sin.to(x.dtype)

    samples = [[0, context // 2, context - 1]]
    if switch is not None:
        samples += [[0, switch // 2, switch - 1], [switch - 1, switch]]
    for sample in samples:
        positions = torch.tensor([sample], device=inv_freq.device)
        with torch.no_grad():
            want, got = original(module, probe, positions), lookup(probe, positions)
        if not all(torch.equal(w, g) for w, g in zip(want, got, strict=True)):
            for name in ("_torchlower_cos", "_torchlower_sin"):
                delattr(module, name)
            return False
    module.forward = lookup  # type: ignore[method-assign]
    return True


def _switch(module: nn.Module, context: int) -> int | None:
    """Longrope's switch length, when the export's positions can cross it."""
    if getattr(module, "rope_type", None) != "longrope":
        return None
    parameters = getattr(module.config, "rope_parameters", None) or {}
    length = parameters.get("original_max_position_embeddings") if isinstance(parameters, dict) else None
    length = length or getattr(module.config, "original_max_position_embeddings", None)
    return int(length) if isinstance(length, int) and length < context else None


def _table(
    module: nn.Module, probe: torch.Tensor, length: int, rows: int
) -> tuple[torch.Tensor, torch.Tensor] | tuple[None, None]:
    """``cos``/``sin`` of positions 0..length-1, computed by the module in one call; ``rows`` rows."""
    positions = torch.arange(length, device=probe.device)[None]
    with torch.no_grad():
        cos, sin = module(probe, positions)
    if cos.dim() != 3 or cos.shape[:2] != (1, length) or sin.shape != cos.shape:
        return None, None
    pad = (0, 0, 0, rows - length)
    return nn.functional.pad(cos[0], pad), nn.functional.pad(sin[0], pad)

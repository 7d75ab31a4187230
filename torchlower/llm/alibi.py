"""Falcon's ALiBi bias traced as a slice of a table built by transformers itself.

Falcon (``alibi=True``) derives the bias from the 2-D attention mask: ``(cumsum(mask) - 1)``
times per-head slopes, rounded through bfloat16. With a symbolic mask length that ``cumsum``
has no static size to lower (and tract has no bfloat16), so the export refused the model.
The wrapper never passes a mask for these models (batch 1, no padding: the mask is all ones)
and then the bias at key ``j`` is the same for every length, so the export computes it once
for ``max_context`` keys with transformers' own ``build_alibi_tensor`` and the graph slices
the first ``P + S`` columns: exactly HF's numbers, bfloat16 rounding included.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

BUFFER = "_torchlower_alibi"


@contextmanager
def alibi_table(model: nn.Module, context: int) -> Iterator[bool]:
    """Inside, Falcon's ``build_alibi_tensor`` reads a [heads, 1, context] table; yields if patched."""
    config = model.config
    base = getattr(model, "transformer", None)
    if config.model_type != "falcon" or not getattr(config, "alibi", False) or base is None:
        yield False
        return
    code = sys.modules[type(base).__module__]
    original = code.build_alibi_tensor
    heads = int(base.num_heads)
    dtype = next(iter(base.parameters())).dtype
    with torch.no_grad():
        full = original(torch.ones(1, context, dtype=torch.long), heads, dtype=dtype)
    base.register_buffer(BUFFER, full, persistent=False)

    def from_table(attention_mask: torch.Tensor, num_heads: int, dtype: torch.dtype) -> Any:
        keys = torch.arange(attention_mask.shape[1], device=attention_mask.device)
        # a gather, not a slice: slicing a fixed-size table would bound P + S in torch.export
        return getattr(base, BUFFER).index_select(2, keys).to(dtype)

    code.build_alibi_tensor = from_table
    try:
        yield True
    finally:
        code.build_alibi_tensor = original
        delattr(base, BUFFER)

"""Stages 4 and 5, compress and optimize: weights packed for the requested format, then tract's
guards and our passes over the lowered graph. Every NNEF export runs them in this order."""

from __future__ import annotations

import torch
from torch import nn

from torchlower.nnef import guards, passes, quant
from torchlower.nnef.builder import NNEFBuilder


def compress(
    builder: NNEFBuilder, module: nn.Module, compress: str | None, keep_float: frozenset[str] = frozenset()
) -> dict[str, torch.Tensor] | None:
    """Pack eligible weights (``compress="q4_0"``) but those named in ``keep_float``; returns
    the dequantized parameters PyTorch checks against, or None without compression."""
    if compress is None:
        return None
    params = dict(module.named_parameters()) | dict(module.named_buffers())
    params = {k: v for k, v in params.items() if k not in keep_float}
    return quant.compress_weights(builder, quant.FORMATS[compress], params)


def optimize(builder: NNEFBuilder) -> None:
    guards.before_passes(builder)  # rewrites the passes may optimize further (nnef/guards.py)
    passes.optimize(builder)  # leaner graph: folds, merges, shared constants (nnef/passes.py)
    guards.apply(builder)  # around tract optimizer bugs (nnef/guards.py)

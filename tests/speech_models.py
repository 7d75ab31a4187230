"""Tiny random speech encoder-decoders from configs (never the hub): Whisper for now.

Weights are drawn with std 0.6 (as ``llm_models``) so greedy chains move; no special tokens are
suppressed or forced, so HF ``generate`` is the plain arg-max chain tract must reproduce.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

WHISPER = {
    "vocab_size": 120,
    "num_mel_bins": 8,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 32,
    "decoder_ffn_dim": 32,
    "d_model": 16,
    "max_source_positions": 20,  # 40 input frames (conv2 has stride 2)
    "max_target_positions": 64,
    "decoder_start_token_id": 1,
    "pad_token_id": 0,
    "eos_token_id": None,
    "bos_token_id": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_decoder_ids": None,
}


def whisper(seed: int = 0, **fields: Any) -> Any:
    """A ``WhisperForConditionalGeneration`` in eval mode with seeded random weights."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.WhisperForConditionalGeneration(transformers.WhisperConfig(**(WHISPER | fields)))
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.6)
    return model.eval()


def whisper_folder(path: Path, seed: int = 0) -> tuple[Path, Any]:
    model = whisper(seed)
    model.save_pretrained(path)
    return path, model


def features(model: Any, seed: int = 0) -> torch.Tensor:
    """Log-mel-like input features [1, mels, 2 * max_source_positions]."""
    g = torch.Generator().manual_seed(seed)
    c = model.config
    return torch.randn(1, c.num_mel_bins, 2 * c.max_source_positions, generator=g)

"""Tiny random speech encoder-decoders from configs (never the hub): Whisper and Speech2Text.

Weights are drawn with std 0.6 (as ``llm_models``) so greedy chains move (Speech2Text's token
embeddings, tied to its LM head and scaled by sqrt(d_model), with std 0.15: larger ones make
every chain repeat one token); no special tokens are suppressed or forced, so HF ``generate``
is the plain arg-max chain tract must reproduce.
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


def _seeded(config: str, model: str, fields: dict[str, Any], seed: int) -> Any:
    """``transformers.<model>(<config>(**fields))`` in eval mode, matrices drawn N(0, 0.6) from
    ``seed`` (spread enough that greedy tokens vary on tiny configs)."""
    import transformers

    torch.manual_seed(seed)
    built = getattr(transformers, model)(getattr(transformers, config)(**fields))
    with torch.no_grad():
        for p in built.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.6)
    return built.eval()


def whisper(seed: int = 0, **fields: Any) -> Any:
    """A ``WhisperForConditionalGeneration`` in eval mode with seeded random weights."""
    return _seeded("WhisperConfig", "WhisperForConditionalGeneration", WHISPER | fields, seed)


def whisper_folder(path: Path, seed: int = 0) -> tuple[Path, Any]:
    """The model's folder with the feature extractor's ``preprocessor_config.json``, as shipped."""
    from transformers import WhisperFeatureExtractor

    model = whisper(seed)
    model.save_pretrained(path)
    WhisperFeatureExtractor(feature_size=WHISPER["num_mel_bins"]).save_pretrained(path)
    return path, model


SPEECH2TEXT = {
    "vocab_size": 120,
    "d_model": 16,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "encoder_ffn_dim": 32,
    "decoder_ffn_dim": 32,
    "conv_channels": 16,
    "input_feat_per_channel": 8,
    "max_source_positions": 30,  # 120 input frames (two stride-2 convolutions)
    "max_target_positions": 64,
    "decoder_start_token_id": 2,
    "pad_token_id": 1,
    "eos_token_id": None,
    "bos_token_id": None,
}


def speech2text(seed: int = 0, **fields: Any) -> Any:
    """A ``Speech2TextForConditionalGeneration`` in eval mode with seeded random weights."""
    model = _seeded("Speech2TextConfig", "Speech2TextForConditionalGeneration", SPEECH2TEXT | fields, seed)
    with torch.no_grad():
        model.model.decoder.embed_tokens.weight.normal_(0.0, 0.15)
    return model


def speech2text_folder(path: Path, seed: int = 0, **fields: Any) -> tuple[Path, Any]:
    model = speech2text(seed, **fields)
    model.save_pretrained(path)
    return path, model


def features(model: Any, seed: int = 0, frames: int | None = None) -> torch.Tensor:
    """Log-mel-like input features: Whisper's [1, mels, 2 * max_source_positions]; Speech2Text's
    [1, frames, features] (default 50 frames)."""
    g = torch.Generator().manual_seed(seed)
    c = model.config
    if c.model_type == "speech_to_text":
        return torch.randn(1, frames or 50, c.input_feat_per_channel * c.input_channels, generator=g)
    return torch.randn(1, c.num_mel_bins, 2 * c.max_source_positions, generator=g)


MOONSHINE = {
    "vocab_size": 120,
    "hidden_size": 16,
    "intermediate_size": 32,
    "encoder_num_hidden_layers": 2,
    "decoder_num_hidden_layers": 2,
    "encoder_num_attention_heads": 2,
    "decoder_num_attention_heads": 2,
    "max_position_embeddings": 64,
    "decoder_start_token_id": 1,
    "pad_token_id": 0,
    "eos_token_id": None,
    "bos_token_id": None,
}


def moonshine(seed: int = 0, **fields: Any) -> Any:
    """A ``MoonshineForConditionalGeneration`` (raw audio in) with seeded random weights."""
    return _seeded("MoonshineConfig", "MoonshineForConditionalGeneration", MOONSHINE | fields, seed)


def moonshine_folder(path: Path, seed: int = 0, **fields: Any) -> tuple[Path, Any]:
    model = moonshine(seed, **fields)
    model.save_pretrained(path)
    return path, model


def audio(seed: int = 0, samples: int = 4000) -> torch.Tensor:
    """Raw audio-like samples [1, samples] (Moonshine's input_values)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, samples, generator=g) * 0.3

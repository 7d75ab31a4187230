"""Whisper as two functions of plain tensors, the graphs of a speech encoder-decoder archive.

- ``EncoderPart(input_features) -> (cross_key_0, cross_value_0, …)``: the encoder and, per
  decoder layer, its cross-attention keys and values ``[1, heads, frames / 2, head_dim]``,
  computed once per utterance;
- ``DecoderPart(input_ids, *self_cache, *cross) -> (outputs, *present)``: one decoder step
  with the self-attention cache in tract's causal-LM naming (``in_cache_key_{i}`` /
  ``in_cache_value_{i}`` [1, heads, P, head_dim] in, ``out_cache_*`` [1, heads, P+S, head_dim]
  out) and the encoder's cross keys/values as inputs read, never recomputed.

The decoder is written from the model's own modules (projections, norms, position table,
``proj_out``) in the order ``WhisperDecoderLayer.forward`` applies them, with positions
``arange(P, P+S)`` and the causal mask built from sizes, so P and S stay symbolic and P = 0
(prefill) works. The export checks it against Hugging Face's ``WhisperForConditionalGeneration``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class Seq2SeqLayout:
    """Sizes of the archive's tensors, read from the model's config and modules."""

    layers: int
    heads: int
    head_dim: int
    frames: int  # input_features' last axis (Whisper pads every input to it)
    mels: int
    source: int  # encoder positions: frames after the convolutions
    vocab: int

    def encoder_outputs(self) -> list[str]:
        return [f"cross_{t}_{i}" for i in range(self.layers) for t in ("key", "value")]

    def decoder_inputs(self) -> list[str]:
        cache = [f"in_cache_{t}_{i}" for i in range(self.layers) for t in ("key", "value")]
        return ["input_ids", *cache, *self.encoder_outputs()]

    def decoder_outputs(self) -> list[str]:
        return ["outputs"] + [f"out_cache_{t}_{i}" for i in range(self.layers) for t in ("key", "value")]

    def empty_cache(self, past: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
        return [torch.zeros(1, self.heads, past, self.head_dim, dtype=dtype) for _ in range(2 * self.layers)]


def layout_of(model: nn.Module) -> Seq2SeqLayout:
    config = model.config
    encoder = model.model.encoder
    attn = model.model.decoder.layers[0].encoder_attn
    frames = config.max_source_positions * encoder.conv1.stride[0] * encoder.conv2.stride[0]
    return Seq2SeqLayout(
        layers=len(model.model.decoder.layers),
        heads=int(attn.num_heads),
        head_dim=int(attn.head_dim),
        frames=int(frames),
        mels=int(config.num_mel_bins),
        source=int(config.max_source_positions),
        vocab=int(config.vocab_size),
    )


def _heads(x: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
    """[1, T, heads * dim] → [1, heads, T, dim]."""
    return x.view(1, -1, heads, dim).transpose(1, 2)


class EncoderPart(nn.Module):
    """``input_features`` [1, mels, frames] → the cross-attention keys and values of every layer."""

    def __init__(self, model: nn.Module, layout: Seq2SeqLayout) -> None:
        super().__init__()
        self.encoder = model.model.encoder
        self.layers = model.model.decoder.layers
        self.layout = layout

    def forward(self, input_features: torch.Tensor) -> tuple[torch.Tensor, ...]:
        hidden = self.encoder(input_features).last_hidden_state
        out = []
        for layer in self.layers:
            attn = layer.encoder_attn
            out.append(_heads(attn.k_proj(hidden), self.layout.heads, self.layout.head_dim))
            out.append(_heads(attn.v_proj(hidden), self.layout.heads, self.layout.head_dim))
        return tuple(out)


class DecoderPart(nn.Module):
    """One decoder step: ``(input_ids, *self_cache, *cross)`` → ``(logits, *present)``."""

    def __init__(self, model: nn.Module, layout: Seq2SeqLayout, last_only: bool = True) -> None:
        super().__init__()
        self.decoder = model.model.decoder
        self.proj_out = model.proj_out
        self.layout = layout
        self.last_only = last_only

    def forward(self, input_ids: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = 2 * self.layout.layers
        past, cross = tensors[:n], tensors[n:]
        d = self.decoder
        seq, start = input_ids.shape[1], past[0].shape[2]
        positions = torch.arange(seq) + start
        hidden = d.embed_tokens(input_ids) + d.embed_positions.weight[positions][None]
        keys = torch.arange(start + seq)
        mask = torch.where(keys[None, :] <= positions[:, None], 0.0, torch.finfo(hidden.dtype).min)
        present: list[torch.Tensor] = []
        for i, layer in enumerate(d.layers):
            residual = hidden
            h = layer.self_attn_layer_norm(hidden)
            k, v = self._project(layer.self_attn, h)
            k = torch.cat([past[2 * i], k], dim=2)
            v = torch.cat([past[2 * i + 1], v], dim=2)
            present += [k, v]
            hidden = residual + self._attend(layer.self_attn, h, k, v, mask[None, None])
            residual = hidden
            h = layer.encoder_attn_layer_norm(hidden)
            hidden = residual + self._attend(layer.encoder_attn, h, cross[2 * i], cross[2 * i + 1], None)
            residual = hidden
            h = layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(hidden))))
            hidden = residual + h
        hidden = d.layer_norm(hidden)
        if self.last_only:
            hidden = hidden[:, -1:, :]
        return (self.proj_out(hidden), *present)

    def _project(self, attn: Any, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        heads, dim = self.layout.heads, self.layout.head_dim
        return _heads(attn.k_proj(h), heads, dim), _heads(attn.v_proj(h), heads, dim)

    def _attend(
        self, attn: Any, h: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """``WhisperAttention``: queries scaled before the product (its original order), no bias
        on keys, softmax in f32 as the eager path does."""
        heads, dim = self.layout.heads, self.layout.head_dim
        q = _heads(attn.q_proj(h) * attn.scaling, heads, dim)
        scores = torch.matmul(q, k.transpose(2, 3))
        if mask is not None:
            scores = scores + mask
        weights = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        out = torch.matmul(weights, v).transpose(1, 2).reshape(1, -1, heads * dim)
        return attn.out_proj(out)

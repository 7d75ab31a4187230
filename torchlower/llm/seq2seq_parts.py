"""Speech encoder-decoders (Whisper, Speech2Text) as two functions of plain tensors, the graphs
of a speech encoder-decoder archive.

- ``EncoderPart(input_features) -> (cross_key_0, cross_value_0, …)``: the encoder and, per
  decoder layer, its cross-attention keys and values ``[1, heads, source, head_dim]``,
  computed once per utterance (``source``: the encoder positions, frames after the
  convolutions: fixed for Whisper, which pads every input to 3000 frames; any length up to the
  encoder's position table for Speech2Text);
- ``DecoderPart(input_ids, *self_cache, *cross) -> (outputs, *present)``: one decoder step
  with the self-attention cache in tract's causal-LM naming (``in_cache_key_{i}`` /
  ``in_cache_value_{i}`` [1, heads, P, head_dim] in, ``out_cache_*`` [1, heads, P+S, head_dim]
  out) and the encoder's cross keys/values as inputs read, never recomputed.

The decoder is written from the model's own modules (projections, norms, position table, LM
head) in the order the decoder layer's ``forward`` applies them, with positions from
``arange(P, P+S)`` and the causal mask built from sizes, so P and S stay symbolic and P = 0
(prefill) works. Speech2Text's positions are its fairseq ones: a padding token sits at
``padding_idx``, every other token at ``padding_idx + 1 + P + (its rank among the new
non-padding tokens)``, as HF's cached decoding computes them. The export checks both parts
against Hugging Face's ``…ForConditionalGeneration``.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    frames: int  # Whisper: input_features' fixed time axis; else the example's (any in min..max_frames)
    mels: int  # features per frame (0: raw audio samples, [1, samples])
    source: int  # encoder positions of ``frames`` (frames after the convolutions)
    vocab: int
    time_axis: int = 2  # Whisper [1, mels, frames]; Speech2Text [1, frames, features] (axis 1)
    min_frames: int | None = None  # a dynamic time axis, min..max frames; None: fixed at ``frames``
    max_frames: int | None = None
    max_source: int | None = None  # encoder positions of ``max_frames``

    @property
    def input_name(self) -> str:
        return "input_features" if self.mels else "input_values"

    @property
    def dynamic(self) -> bool:
        return self.max_frames is not None

    def features_shape(self, frames: int | str | None = None) -> list[int | str]:
        """``input_features``' shape for ``frames`` (default: the example's)."""
        t: int | str = self.frames if frames is None else frames
        if not self.mels:  # raw audio (Moonshine's input_values)
            return [1, t]
        return [1, self.mels, t] if self.time_axis == 2 else [1, t, self.mels]

    def encoder_outputs(self) -> list[str]:
        return [f"cross_{t}_{i}" for i in range(self.layers) for t in ("key", "value")]

    def decoder_inputs(self) -> list[str]:
        cache = [f"in_cache_{t}_{i}" for i in range(self.layers) for t in ("key", "value")]
        return ["input_ids", *cache, *self.encoder_outputs()]

    def decoder_outputs(self) -> list[str]:
        return ["outputs"] + [f"out_cache_{t}_{i}" for i in range(self.layers) for t in ("key", "value")]

    def empty_cache(self, past: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
        return [torch.zeros(1, self.heads, past, self.head_dim, dtype=dtype) for _ in range(2 * self.layers)]


def conv_length(convs: list[nn.Conv1d], frames: int) -> int:
    """Positions after ``convs`` (1-D, applied in order) of ``frames`` input frames."""
    for conv in convs:
        frames = (frames + 2 * conv.padding[0] - conv.kernel_size[0]) // conv.stride[0] + 1
    return frames


def split_heads(x: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
    """[1, T, heads * dim] → [1, heads, T, dim]."""
    return x.view(1, -1, heads, dim).transpose(1, 2)


class EncoderPart(nn.Module):
    """``input_features`` → the cross-attention keys and values of every decoder layer."""

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
            out.append(split_heads(attn.k_proj(hidden), self.layout.heads, self.layout.head_dim))
            out.append(split_heads(attn.v_proj(hidden), self.layout.heads, self.layout.head_dim))
        return tuple(out)


class DecoderPart(nn.Module):
    """One decoder step: ``(input_ids, *self_cache, *cross)`` → ``(logits, *present)`` (Whisper)."""

    def __init__(self, model: nn.Module, layout: Seq2SeqLayout, last_only: bool = True) -> None:
        super().__init__()
        self.decoder = model.model.decoder
        self.layout = layout
        self.last_only = last_only
        self._keep_head(model)

    def _keep_head(self, model: nn.Module) -> None:
        self.proj_out = model.proj_out

    def _step(self, input_ids: torch.Tensor, tensors: Sequence[torch.Tensor]) -> tuple[Any, Any, Any, int]:
        """A step's self-attention cache, cross K/V, positions (continuing the cache) and start."""
        n = 2 * self.layout.layers
        past, cross = tensors[:n], tensors[n:]
        start = past[0].shape[2]
        return past, cross, torch.arange(input_ids.shape[1]) + start, start

    @staticmethod
    def _causal(positions: torch.Tensor, start: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive mask: each new position sees the cache and the new positions up to itself."""
        keys = torch.arange(start + positions.shape[0])
        return torch.where(keys[None, :] <= positions[:, None], 0.0, torch.finfo(dtype).min)

    def forward(self, input_ids: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        past, cross, positions, start = self._step(input_ids, tensors)
        d = self.decoder
        hidden = self._embed(input_ids, positions, start)
        mask = self._causal(positions, start, hidden.dtype)
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
        return (self._logits(hidden), *present)

    def _embed(self, input_ids: torch.Tensor, positions: torch.Tensor, start: int) -> torch.Tensor:
        d = self.decoder
        return d.embed_tokens(input_ids) + d.embed_positions.weight[positions][None]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj_out(hidden)

    def _project(self, attn: Any, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        heads, dim = self.layout.heads, self.layout.head_dim
        return split_heads(attn.k_proj(h), heads, dim), split_heads(attn.v_proj(h), heads, dim)

    def _attend(
        self, attn: Any, h: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """``WhisperAttention``: queries scaled before the product (its original order), no bias
        on keys, softmax in f32 as the eager path does."""
        heads, dim = self.layout.heads, self.layout.head_dim
        q = split_heads(attn.q_proj(h) * attn.scaling, heads, dim)
        scores = torch.matmul(q, k.transpose(2, 3))
        return self._weigh(attn, scores, v, mask)

    def _weigh(
        self, attn: Any, scores: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        heads, dim = self.layout.heads, self.layout.head_dim
        if mask is not None:
            scores = scores + mask
        weights = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        out = torch.matmul(weights, v).transpose(1, 2).reshape(1, -1, heads * dim)
        return attn.out_proj(out)


class Speech2TextDecoderPart(DecoderPart):
    """Speech2Text's decoder step: embeddings scaled by ``embed_scale``, fairseq positions from
    the sinusoidal table (padding tokens at ``padding_idx``), scores scaled after the product
    (``eager_attention_forward``), the LM head tied to the embeddings or not."""

    def _keep_head(self, model: nn.Module) -> None:
        self.lm_head = model.lm_head
        self.padding_idx = int(model.model.decoder.padding_idx)

    def _embed(self, input_ids: torch.Tensor, positions: torch.Tensor, start: int) -> torch.Tensor:
        d = self.decoder
        real = (input_ids != self.padding_idx).long()
        ids = (torch.cumsum(real, dim=1) + start) * real + self.padding_idx
        return d.embed_tokens(input_ids) * d.embed_scale + d.embed_positions.weights[ids[0]][None]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)

    def _attend(
        self, attn: Any, h: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        q = split_heads(attn.q_proj(h), self.layout.heads, self.layout.head_dim)
        scores = torch.matmul(q, k.transpose(2, 3)) * attn.scaling
        return self._weigh(attn, scores, v, mask)

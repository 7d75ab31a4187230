"""Moonshine's decoder step and layout (``seq2seq_parts.py``: the shared encoder part and
layout; ``seq2seq_families.py`` picks them): raw audio in.

The encoder takes ``input_values`` [1, samples] (16 kHz audio, any length from 895 samples:
its three convolutions, strides 64, 3 and 2, need one output position) and its rotary
positions are computed, not read from a table, so only the archive's bound caps the length.
The decoder step applies the rotary embedding (interleaved pairs, possibly partial) to the new
queries and keys with positions ``arange(P, P+S)``; the cache holds the rotated keys as HF's
does; cross-attention takes no rotary embedding; the MLP is HF's gated one.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn

from torchlower.llm.seq2seq_parts import DecoderPart, Seq2SeqLayout, conv_length, split_heads

MAX_SAMPLES = 16000 * 64  # the archive's bound on input_values: 64 s of 16 kHz audio


def moonshine_layout(model: nn.Module, sizes: dict[str, int]) -> Seq2SeqLayout:
    encoder = model.model.encoder
    convs = [encoder.conv1, encoder.conv2, encoder.conv3]
    low = 1
    for conv in reversed(convs):  # the fewest samples giving one position after each conv
        low = (low - 1) * conv.stride[0] + conv.kernel_size[0]
    frames = max(low, 4000)
    return Seq2SeqLayout(
        **sizes, frames=frames, mels=0, source=conv_length(convs, frames), time_axis=1, min_frames=low,
        max_frames=MAX_SAMPLES, max_source=conv_length(convs, MAX_SAMPLES),
    )  # fmt: skip


class MoonshineDecoderPart(DecoderPart):
    """Moonshine's decoder step (pre-norm layers without biases on the norms, rotary self
    attention, grouped key/value heads repeated for the queries, gated MLP, tied LM head)."""

    def _keep_head(self, model: nn.Module) -> None:
        self.proj_out = model.proj_out
        self.rotary = sys.modules[type(self.decoder).__module__].apply_rotary_pos_emb

    def forward(self, input_ids: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        past, cross, positions, start = self._step(input_ids, tensors)
        d = self.decoder
        hidden = d.embed_tokens(input_ids)
        cos, sin = d.rotary_emb(hidden, position_ids=positions[None])
        mask = self._causal(positions, start, hidden.dtype)
        present: list[torch.Tensor] = []
        for i, layer in enumerate(d.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(hidden)
            q = self._queries(attn, h)
            k, v = self._project(attn, h)
            q, k = self.rotary(q, k, cos, sin)
            k = torch.cat([past[2 * i], k], dim=2)
            v = torch.cat([past[2 * i + 1], v], dim=2)
            present += [k, v]
            hidden = hidden + self._scores(attn, q, k, v, mask[None, None])
            h = layer.post_attention_layernorm(hidden)
            hidden = hidden + self._scores(
                layer.encoder_attn, self._queries(layer.encoder_attn, h), cross[2 * i], cross[2 * i + 1], None
            )
            hidden = hidden + layer.mlp(layer.final_layernorm(hidden))
        hidden = d.norm(hidden)
        if self.last_only:
            hidden = hidden[:, -1:, :]
        return (self.proj_out(hidden), *present)

    def _queries(self, attn: Any, h: torch.Tensor) -> torch.Tensor:
        dim = self.layout.head_dim
        return split_heads(attn.q_proj(h), attn.q_proj.out_features // dim, dim)

    def _scores(
        self, attn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """``eager_attention_forward``: keys/values repeated per query group, scores scaled
        after the product, softmax in f32."""
        groups = q.shape[1] // k.shape[1]
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q, k.transpose(2, 3)) * attn.scaling
        if mask is not None:
            scores = scores + mask
        weights = torch.softmax(scores.float(), dim=-1).to(v.dtype)
        out = torch.matmul(weights, v).transpose(1, 2).reshape(1, -1, q.shape[1] * q.shape[3])
        return attn.o_proj(out)

"""A multimodal LM (LLaVA, …) as three functions of plain tensors, the graphs of its export.

- ``EmbedPart(input_ids) -> inputs_embeds`` [1, S, hidden]: the decoder's token embedding
  (with the model's own scaling, e.g. Gemma's), so text steps and media steps feed the decoder
  the same kind of input;
- an encoder part, e.g. ``LlavaVisionPart(pixel_values) -> image_features`` [1, tokens,
  hidden]: the vision tower and the projector, one image per call (what HF's
  ``get_image_features`` returns, in the decoder's hidden size);
- the decoder, ``wrapper.EmbedsCausalLM(inputs_embeds, *past) -> (logits, *present)``: the
  causal-LM graph with the KV cache in tract's naming, fed embeddings instead of ids.

``Qwen2AudioPart(input_features, feature_attention_mask) -> (audio_features, audio_tokens)``
is the audio encoder of Qwen2-Audio (Whisper-like, average-pooled) and its projector.

Between them (``vlm_runner.py``), as HF's ``masked_scatter`` does: the rows of
``inputs_embeds`` at the image token's positions are replaced, in order, by the features.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass(frozen=True)
class MediaLayout:
    """What the encoder part takes and gives, and where its output goes in the prompt."""

    part: str  # the manifest entry and archive stem: "vision" or "audio"
    input_name: str  # pixel_values / input_features
    input_shape: tuple[int, ...]  # one item (batch 1)
    output_name: str  # image_features / audio_features
    token_id: int  # the placeholder token whose embedding rows the features replace
    tokens: int  # feature rows per item (at most, with ``count_name``)
    hidden: int  # the decoder's hidden size (each row's width)
    mask_name: str | None = None  # a second input: which frames of the item are real (1) or padding (0)
    count_name: str | None = None  # a second output: how many of the feature rows are real
    frontend: str = "export"  # what lowers the encoder (jit: Qwen2-VL's grid-dependent python)

    @property
    def input_names(self) -> list[str]:
        return [self.input_name] + ([self.mask_name] if self.mask_name else [])

    @property
    def output_names(self) -> list[str]:
        return [self.output_name] + ([self.count_name] if self.count_name else [])


class EmbedPart(nn.Module):
    """``input_ids`` [1, S] → the decoder's input embeddings [1, S, hidden]."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.embed = model.get_input_embeddings()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed(input_ids)


class LlavaVisionPart(nn.Module):
    """``pixel_values`` [1, 3, H, W] → projected image features [1, tokens, hidden], through
    HF's ``get_image_features`` with the config's feature layer and selection strategy."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model.model
        config = model.config
        self.layer = config.vision_feature_layer
        self.strategy = config.vision_feature_select_strategy

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        out = self.model.get_image_features(
            pixel_values=pixel_values,
            vision_feature_layer=self.layer,
            vision_feature_select_strategy=self.strategy,
        )
        return torch.stack(list(out.pooler_output))


class Idefics3VisionPart(nn.Module):
    """Idefics3 / SmolVLM: ``pixel_values`` [1, 3, size, size] (one tile: the processor splits
    and resizes images into tiles of ``vision_config.image_size``) → [1, tokens, hidden]: the
    vision transformer with every patch real, then the connector (pixel shuffle by
    ``scale_factor`` and its projection). HF's ``get_image_features`` drops all-zero padding
    tiles first, a data-dependent filter: the runner is given real tiles only."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.vision = model.model.vision_model
        self.connector = model.model.connector

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.connector(self.vision(pixel_values=pixel_values).last_hidden_state)


class Gemma3VisionPart(nn.Module):
    """Gemma 3: ``pixel_values`` [1, 3, size, size] → [1, mm_tokens_per_image, hidden]: the SigLIP
    tower's last hidden state, average-pooled to the token grid, RMS-normed (``mm_soft_emb_norm``)
    and projected, HF's ``get_image_features``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model.model

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.model.get_image_features(pixel_values=pixel_values).pooler_output


def vision_layout(model: nn.Module, part: nn.Module) -> MediaLayout:
    """The vision layout of a LLaVA / Idefics3 model, its token count from one run of ``part``
    on fake tensors (no weight read)."""
    from torchlower.pipeline.reference import fake_run

    config = model.config
    size = int(config.vision_config.image_size)
    shape = (1, int(config.vision_config.num_channels), size, size)
    rows = fake_run(part, (torch.zeros(shape),)).shape  # type: ignore[attr-defined]
    return MediaLayout(
        "vision", "pixel_values", shape, "image_features", int(config.image_token_id), int(rows[1]),
        int(rows[2]),
    )  # fmt: skip


class Qwen2VLVisionPart(nn.Module):
    """Qwen2-VL: ``pixel_values`` [1, patches, channels · temporal · patch²] (the processor's
    flattened patches of one image) → [1, tokens, hidden], for the one patch grid ``[t, h, w]``
    the export fixes (the vision tower's rotary table and attention spans follow the grid;
    lowered by the jit front end, which records them for that grid)."""

    def __init__(self, model: nn.Module, grid: tuple[int, int, int]) -> None:
        super().__init__()
        self.visual = model.model.visual
        self.grid = grid

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.visual(pixel_values[0], grid_thw=torch.tensor([self.grid])).pooler_output[None]


def qwen2_vl_layout(model: nn.Module, grid: tuple[int, int, int]) -> MediaLayout:
    vision = model.config.vision_config
    patch = int(vision.in_channels) * int(vision.temporal_patch_size) * int(vision.patch_size) ** 2
    merge = int(vision.spatial_merge_size) ** 2
    patches = grid[0] * grid[1] * grid[2]
    return MediaLayout(
        "vision", "pixel_values", (1, patches, patch), "image_features", int(model.config.image_token_id),
        patches // merge, int(model.config.text_config.hidden_size), frontend="jit",
    )  # fmt: skip


class Qwen2AudioPart(nn.Module):
    """``(input_features [1, mels, frames], feature_attention_mask [1, frames])`` → projected
    audio features [1, tokens, hidden] and how many are real ([1], the rest come from padding).

    The padded frames are masked out of the encoder's attention keys as HF's forward masks them
    (an additive mask built from the real length after the first convolution), and the count is
    HF's ``_get_feat_extract_output_lengths``: HF keeps that many rows.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.tower = model.model.audio_tower
        self.projector = model.model.multi_modal_projector

    def forward(
        self, input_features: torch.Tensor, feature_attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        frames, real = self.tower._get_feat_extract_output_lengths(feature_attention_mask.sum(-1))
        positions = (input_features.shape[-1] - 2) // 2 + 1  # after the stride-2 convolution
        keep = torch.arange(positions)[None, :] < frames[:, None]
        low = torch.finfo(input_features.dtype).min
        mask = torch.where(keep, 0.0, low).to(input_features.dtype)[:, None, None, :]
        hidden = self.tower(input_features, attention_mask=mask).last_hidden_state
        return self.projector(hidden), real


def qwen2_audio_layout(model: nn.Module) -> MediaLayout:
    audio = model.config.audio_config
    frames = int(audio.max_source_positions) * 2  # the stride-2 convolution; HF requires this length
    tokens = (int(audio.max_source_positions) - 2) // 2 + 1  # the stride-2 average pool
    return MediaLayout(
        "audio", "input_features", (1, int(audio.num_mel_bins), frames), "audio_features",
        int(model.config.audio_token_id), tokens, int(model.config.text_config.hidden_size),
        "feature_attention_mask", "audio_tokens",
    )  # fmt: skip


def scatter_media(embeds: Any, ids: Any, token_id: int, features: Any) -> Any:
    """``embeds`` with the rows where ``ids == token_id`` replaced by ``features``' rows, in
    order (HF's ``masked_scatter``); numpy arrays [1, S, hidden], [1, S], [n, hidden]."""
    out = embeds.copy()
    out[0, ids[0] == token_id] = features.astype(out.dtype)
    return out

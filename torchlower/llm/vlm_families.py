"""Which parts a multimodal LM has, by ``model_type``: the class its config names, its media
encoder part and layout, its language model (whose tables bound the context), and the
preprocessing its encoder expects (read from the bundled ``preprocessor_config.json``)."""

from __future__ import annotations

import json
from typing import Any

import torch
from torch import nn

from torchlower.llm.vlm_parts import (
    Gemma3VisionPart,
    Idefics3VisionPart,
    LlavaVisionPart,
    MediaLayout,
    Qwen2AudioPart,
    Qwen2VLVisionPart,
    qwen2_audio_layout,
    qwen2_vl_layout,
    vision_layout,
)

# model_type → the class its config names (what ``source.open_named`` loads)
ARCHITECTURES = {
    "llava": "LlavaForConditionalGeneration",
    "qwen2_audio": "Qwen2AudioForConditionalGeneration",
    "idefics3": "Idefics3ForConditionalGeneration",
    "smolvlm": "SmolVLMForConditionalGeneration",
    "qwen2_vl": "Qwen2VLForConditionalGeneration",
    "qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration",
    "gemma3": "Gemma3ForConditionalGeneration",
}
# models whose image tokens see each other both ways within one image (HF's token_type_ids
# mask): the decoder takes the new tokens' image-block ids as a second input
IMAGE_BLOCKS = ("gemma3",)
# models with Qwen2-VL's flattened patches, one fixed grid and M-RoPE positions (Qwen2.5-VL's
# tower adds windowed attention, traced for the grid as the rest)
MROPE = ("qwen2_vl", "qwen2_5_vl")
# Qwen2-VL's one image grid per export, in merged tokens per side (an image of
# 4 · spatial_merge_size · patch_size pixels a side, 16 tokens)
QWEN2_VL_TOKENS_SIDE = 4
# HF's forward takes these models' pixel_values with an images axis: [batch, images, 3, H, W]
IMAGES_AXIS = ("idefics3", "smolvlm")
# what each encoder's preprocessing is, as the model's processor does it (preprocessor_config.json)
PREPROCESSING_KEYS = {
    "vision": ("image_processor_type", "do_resize", "size", "crop_size", "resample", "do_rescale",
               "rescale_factor", "do_normalize", "image_mean", "image_std", "do_convert_rgb",
               "do_pan_and_scan"),
    "audio": ("feature_extractor_type", "feature_size", "sampling_rate", "n_fft", "hop_length",
              "chunk_length", "n_samples", "padding_value"),
}  # fmt: skip


def media_part(model: nn.Module) -> tuple[nn.Module, MediaLayout]:
    """The encoder part of ``model`` (eval mode) and its layout."""
    if model.config.model_type == "qwen2_audio":
        return Qwen2AudioPart(model).eval(), qwen2_audio_layout(model)
    kind = model.config.model_type
    if kind in MROPE:
        grid = image_grid(model)
        return Qwen2VLVisionPart(model, grid).eval(), qwen2_vl_layout(model, grid)
    if kind == "gemma3":
        part: nn.Module = Gemma3VisionPart(model).eval()
        return part, vision_layout(model, part)
    part = (Idefics3VisionPart if kind in IMAGES_AXIS else LlavaVisionPart)(model).eval()
    return part, vision_layout(model, part)


def language_model(model: nn.Module) -> nn.Module:
    """The decoder stack (its position tables bound ``max_context``; the media tower's do not)."""
    inner = model.model
    return inner.text_model if hasattr(inner, "text_model") else inner.language_model


def preprocessing(files: dict[str, bytes], part: str) -> dict[str, Any]:
    """The bundled preprocessor's settings for ``part`` ({} when the folder had none)."""
    blob = files.get("preprocessor_config.json")
    if blob is None:
        return {}
    data = json.loads(blob)
    return {k: data[k] for k in PREPROCESSING_KEYS[part] if k in data} | {
        "source": "preprocessor_config.json"
    }


def media_example(media: MediaLayout, seed: int) -> tuple[torch.Tensor, ...]:
    """One item of media (random features; for audio, the last quarter of frames padding)."""
    item = torch.randn(media.input_shape, generator=torch.Generator().manual_seed(seed))
    if media.mask_name is None:
        return (item,)
    frames = media.input_shape[-1]
    return item, (torch.arange(frames) < frames - frames // 4).long()[None]


def image_grid(model: nn.Module) -> tuple[int, int, int]:
    """Qwen2-VL's patch grid ``[t, h, w]`` of the exported image size."""
    side = QWEN2_VL_TOKENS_SIDE * int(model.config.vision_config.spatial_merge_size)
    return (1, side, side)


def positions(model: nn.Module) -> dict[str, Any] | None:
    """The manifest's ``positions``: how the runner computes Qwen2-VL's M-RoPE input (``mrope.py``)."""
    if model.config.model_type not in MROPE:
        return None
    merge = int(model.config.vision_config.spatial_merge_size)
    t, h, w = image_grid(model)
    return {"kind": "mrope", "input": "position_ids", "image_grid_thw": [t, h, w],
            "merged_grid": [t, h // merge, w // merge]}  # fmt: skip


def attention(model: nn.Module) -> dict[str, Any] | None:
    """The manifest's ``attention``: how the runner computes Gemma 3's image-block input (None:
    the decoder's mask is causal from positions alone)."""
    if model.config.model_type not in IMAGE_BLOCKS:
        return None
    return {
        "kind": "image_blocks",
        "input": "image_blocks",
        "blocks": "prefill: runs of media.token_id numbered 1, 2, ...; 0 for text and every later step",
        "mask": "causal, or the same nonzero block among the new tokens; the past always visible",
    }


def decoder_feeds(model: nn.Module) -> list[str]:
    """The decoder's inputs before its caches."""
    extra = ["position_ids"] if positions(model) else ["image_blocks"] if attention(model) else []
    return ["inputs_embeds", *extra]


def media_inputs(
    model: nn.Module, media: MediaLayout, example: tuple[torch.Tensor, ...], prompt: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The keyword arguments HF's forward takes the prompt's media by (``example``: the graph's
    inputs for one item)."""
    kind = model.config.model_type
    if kind in IMAGES_AXIS:
        example = (example[0][None],)
    if kind in MROPE:
        return {"pixel_values": example[0][0], "image_grid_thw": torch.tensor([image_grid(model)]),
                "mm_token_type_ids": (prompt == media.token_id).int()}  # fmt: skip
    if kind in IMAGE_BLOCKS:  # what Gemma 3's processor gives with the pixels
        return {"pixel_values": example[0], "token_type_ids": (prompt == media.token_id).long()}
    return dict(zip(media.input_names, example, strict=True))

"""Tiny random multimodal LMs from configs (never the hub): LLaVA (CLIP vision tower, Llama text).

Matrices drawn N(0, 0.6) as in ``speech_models`` so greedy chains move; no bos/eos/pad ids, so
HF ``generate`` is the plain arg-max chain tract must reproduce. ``vision_feature_layer=-1``
so every checkpoint weight takes part in the graph (LLaVA's usual -2 leaves the last vision
layer unused by HF itself).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CLIP = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": 16,
    "patch_size": 4,  # 16 patches: 16 image rows per image
    "projection_dim": 16,
}
LLAMA = {
    "vocab_size": 160,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "bos_token_id": None,
    "eos_token_id": None,
    "pad_token_id": None,
}
IMAGE_TOKEN = 150


def _spread(model: Any, seed: int) -> Any:
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.6)
    return model.eval()


def llava(seed: int = 0, **fields: Any) -> Any:
    """A ``LlavaForConditionalGeneration`` with seeded random weights."""
    import transformers

    config = transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(**CLIP),
        text_config=transformers.LlamaConfig(**LLAMA),
        image_token_id=IMAGE_TOKEN,
        vision_feature_layer=-1,
        vision_feature_select_strategy="default",
        **fields,
    )
    torch.manual_seed(seed)
    return _spread(transformers.LlavaForConditionalGeneration(config), seed)


def llava_folder(path: Path, seed: int = 0) -> tuple[Path, Any]:
    """The model saved with a CLIP image processor's ``preprocessor_config.json`` (its sizes)."""
    import transformers

    model = llava(seed)
    model.save_pretrained(path)
    size = CLIP["image_size"]
    transformers.CLIPImageProcessor(size={"shortest_edge": size}, crop_size=size).save_pretrained(path)
    return path, model


def pixels(model: Any, seed: int = 0, images: int = 1) -> torch.Tensor:
    """Normalized-image-like pixel values [images, 3, size, size]."""
    size = model.config.vision_config.image_size
    return torch.randn(images, 3, size, size, generator=torch.Generator().manual_seed(seed))


def prompt(model: Any, images: int = 1, seed: int = 0, text: tuple[int, int] = (4, 3)) -> torch.Tensor:
    """Text ids around ``images`` runs of image tokens (one per feature row), as LLaVA's processor
    writes them."""
    from torchlower.llm.vlm import check_prompt
    from torchlower.llm.vlm_families import media_part

    layout = media_part(model)[1]
    g = torch.Generator().manual_seed(seed)
    vocab = model.config.text_config.vocab_size
    ids = check_prompt(layout, vocab, layout.tokens * min(images, 1), seed=seed)[0]
    head = torch.randint(0, IMAGE_TOKEN, (text[0],), generator=g)
    more = [torch.tensor([7]), torch.full((layout.tokens,), IMAGE_TOKEN)] * max(images - 1, 0)
    return torch.cat([head, ids, *more, torch.tensor([9])])[None]  # a text token between images


QWEN2_AUDIO_ENCODER = {
    "d_model": 16,
    "encoder_layers": 2,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 32,
    "num_mel_bins": 8,
    "max_source_positions": 20,  # 40 input frames, 10 audio rows
}
AUDIO_TOKEN = 151


def qwen2_audio(seed: int = 0) -> Any:
    """A ``Qwen2AudioForConditionalGeneration`` (Whisper-like encoder, Qwen2 text) with seeded
    random weights."""
    import transformers

    text = LLAMA | {"num_key_value_heads": 2}
    config = transformers.Qwen2AudioConfig(
        audio_config=transformers.Qwen2AudioEncoderConfig(**QWEN2_AUDIO_ENCODER),
        text_config=transformers.Qwen2Config(**text),
        audio_token_index=AUDIO_TOKEN,
    )
    torch.manual_seed(seed)
    return _spread(transformers.Qwen2AudioForConditionalGeneration(config), seed)


def qwen2_audio_folder(path: Path, seed: int = 0) -> tuple[Path, Any]:
    model = qwen2_audio(seed)
    model.save_pretrained(path)
    return path, model


def audio_features(model: Any, seed: int = 0, real: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-mel-like features [1, mels, 2 * max_source_positions] and the mask of the ``real``
    first frames (default all)."""
    audio = model.config.audio_config
    frames = 2 * audio.max_source_positions
    features = torch.randn(1, audio.num_mel_bins, frames, generator=torch.Generator().manual_seed(seed))
    mask = (torch.arange(frames) < (frames if real is None else real)).long()[None]
    return features, mask


def audio_prompt(model: Any, mask: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """Text ids around one audio token per real audio row (what Qwen2-Audio's processor writes)."""
    rows = int(model.model.audio_tower._get_feat_extract_output_lengths(mask.sum(-1))[1])
    g = torch.Generator().manual_seed(seed)
    before, after = torch.randint(0, 150, (4,), generator=g), torch.randint(0, 150, (3,), generator=g)
    return torch.cat([before, torch.full((rows,), AUDIO_TOKEN), after])[None]


IDEFICS3_VISION = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": 32,
    "patch_size": 4,  # 64 patches, pixel-shuffled by 2: 16 image rows per tile
}


def idefics3(seed: int = 0, kind: str = "Idefics3") -> Any:
    """An ``Idefics3ForConditionalGeneration`` (or SmolVLM's, ``kind="SmolVLM"``) with seeded
    random weights: a SigLIP-like tower, a pixel-shuffle connector, a Llama text model."""
    import transformers

    config = getattr(transformers, f"{kind}Config")(
        vision_config=getattr(transformers, f"{kind}VisionConfig")(**IDEFICS3_VISION),
        text_config=transformers.LlamaConfig(**LLAMA),
        scale_factor=2,
        image_token_id=IMAGE_TOKEN,
    )
    torch.manual_seed(seed)
    return _spread(getattr(transformers, f"{kind}ForConditionalGeneration")(config), seed)


def idefics3_folder(path: Path, seed: int = 0, kind: str = "Idefics3") -> tuple[Path, Any]:
    model = idefics3(seed, kind)
    model.save_pretrained(path)
    return path, model


QWEN2_VL_VISION = {
    "depth": 2,
    "embed_dim": 16,
    "hidden_size": 32,  # the text model's
    "num_heads": 2,
    "mlp_ratio": 2,
    "patch_size": 4,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "in_channels": 3,
}


def qwen2_vl(seed: int = 0) -> Any:
    """A ``Qwen2VLForConditionalGeneration`` with seeded random weights (M-RoPE sections 1, 1, 2)."""
    import transformers

    rope = {"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0}
    config = transformers.Qwen2VLConfig(
        vision_config=QWEN2_VL_VISION,
        text_config=LLAMA | {"rope_parameters": rope},
        image_token_id=IMAGE_TOKEN,
        vision_start_token_id=151,
        vision_end_token_id=152,
        video_token_id=153,
    )
    torch.manual_seed(seed)
    return _spread(transformers.Qwen2VLForConditionalGeneration(config), seed)


def qwen2_vl_folder(path: Path, seed: int = 0) -> tuple[Path, Any]:
    model = qwen2_vl(seed)
    model.save_pretrained(path)
    return path, model


QWEN2_5_VL_VISION = {
    "depth": 2,  # block 0 windowed, block 1 full (fullatt_block_indexes)
    "hidden_size": 16,
    "intermediate_size": 32,
    "out_hidden_size": 32,  # the text model's
    "num_heads": 2,
    "patch_size": 4,
    "spatial_merge_size": 2,
    "temporal_patch_size": 2,
    "in_channels": 3,
    "window_size": 16,  # 2 × 2 merged tokens a window: the 4 × 4 merged grid is 4 windows
    "fullatt_block_indexes": [1],
}


def qwen2_5_vl(seed: int = 0) -> Any:
    """A ``Qwen2_5_VLForConditionalGeneration`` with seeded random weights: Qwen2-VL's text model
    and M-RoPE, a vision tower with RMS norms, gated MLPs and windowed attention."""
    import transformers

    rope = {"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 10000.0}
    config = transformers.Qwen2_5_VLConfig(
        vision_config=QWEN2_5_VL_VISION,
        text_config=LLAMA | {"rope_parameters": rope},
        image_token_id=IMAGE_TOKEN,
        vision_start_token_id=151,
        vision_end_token_id=152,
        video_token_id=153,
    )
    torch.manual_seed(seed)
    return _spread(transformers.Qwen2_5_VLForConditionalGeneration(config), seed)


def qwen2_5_vl_folder(path: Path, seed: int = 0) -> tuple[Path, Any]:
    model = qwen2_5_vl(seed)
    model.save_pretrained(path)
    return path, model


def qwen2_vl_pixels(model: Any, seed: int = 0, images: int = 1) -> torch.Tensor:
    """Flattened patches of ``images`` images of the exported grid, concatenated: [images · 64, 96]."""
    from torchlower.llm.vlm_families import image_grid

    v = model.config.vision_config
    patches = int(torch.tensor(image_grid(model)).prod())
    width = v.in_channels * v.temporal_patch_size * v.patch_size**2
    return torch.randn(images * patches, width, generator=torch.Generator().manual_seed(seed))


SIGLIP = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": 32,
    "patch_size": 4,  # 8 × 8 patches, average-pooled by 2: 16 image rows per image
}
GEMMA3_TEXT = LLAMA | {
    "num_hidden_layers": 3,  # sliding, sliding, full (pattern 3)
    "head_dim": 16,
    "query_pre_attn_scalar": 16,
    "sliding_window": 12,  # smaller than an image block plus its text: the window bites in the check
    "sliding_window_pattern": 3,
    "tie_word_embeddings": False,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
    },
}


def gemma3(seed: int = 0) -> Any:
    """A ``Gemma3ForConditionalGeneration`` (SigLIP tower, pooled and RMS-normed projector, Gemma 3
    text with sliding and full layers) with seeded random weights."""
    import transformers

    config = transformers.Gemma3Config(
        vision_config=transformers.SiglipVisionConfig(**SIGLIP),
        text_config=transformers.Gemma3TextConfig(**GEMMA3_TEXT),
        mm_tokens_per_image=16,
        image_token_index=IMAGE_TOKEN,
        boi_token_index=151,
        eoi_token_index=152,
        tie_word_embeddings=False,  # tied, the scaled embedding makes the chain repeat its last token
    )
    torch.manual_seed(seed)
    model = _spread(transformers.Gemma3ForConditionalGeneration(config), seed)
    with torch.no_grad():  # HF initializes the projector at zero
        model.model.multi_modal_projector.mm_input_projection_weight.normal_(0.0, 0.6)
    return model


def gemma3_folder(path: Path, seed: int = 0) -> tuple[Path, Any]:
    """The model saved with Gemma 3's image processor (its sizes)."""
    import transformers

    model = gemma3(seed)
    model.save_pretrained(path)
    size = SIGLIP["image_size"]
    transformers.Gemma3ImageProcessor(size={"height": size, "width": size}).save_pretrained(path)
    return path, model

"""Gemma 3 end to end (issue 31): HF lets one image's tokens attend to each other both ways
during prefill (the ``token_type_ids`` mask), which a causal mask cannot say. The decoder takes
``image_blocks`` [1, S] (the new tokens' image numbers, 0 for text), recorded in the manifest's
``attention`` and fed by the runner; the mask is "causal, or the same nonzero block", within
the sliding window on sliding layers. ``torchlower llm export`` of a tiny random folder, then
``torchlower.llm.generate`` gives HF ``generate``'s greedy tokens with one image, two and none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests import vlm_models

pytest.importorskip("transformers")
from torchlower import llm
from torchlower.llm.vlm import hf_decode
from torchlower.llm.vlm_runner import MultimodalRunner, image_blocks

pytestmark = pytest.mark.xdist_group("gemma3")  # one worker exports it once (archive_exports)


@pytest.fixture(scope="module")
def gemma3(exports: Any) -> tuple[Path, Any]:
    return exports.folder("gemma3")


@pytest.fixture(scope="module")
def exported(exports: Any) -> tuple[Path, dict[str, Any]]:
    """The shared export (tests/archive_exports.py) and its manifest."""
    path = exports.exported("gemma3").path
    return path, json.loads((path / "manifest.json").read_text())


def _media(ids: torch.Tensor, pixels: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """What Gemma 3's processor gives HF with the pixels: the image tokens' types."""
    if pixels is None:
        return {}
    return {"pixel_values": pixels, "token_type_ids": (ids == vlm_models.IMAGE_TOKEN).long()}


@pytest.mark.parametrize("images", [1, 2, 0])
def test_f32_tokens_and_logits_equal_hf(
    gemma3: tuple[Path, Any], exported: tuple[Path, dict[str, Any]], images: int
) -> None:
    model, path = gemma3[1], exported[0]
    ids = vlm_models.prompt(model, images=images, seed=images)
    pixels = vlm_models.pixels(model, seed=10 + images, images=images) if images else None
    media = _media(ids, pixels)
    with torch.no_grad():
        out = model.generate(input_ids=ids, **media, max_new_tokens=32, min_new_tokens=32, do_sample=False)
    want = out[0, ids.shape[1] :].tolist()
    assert llm.generate(path, ids, 32, pixel_values=pixels) == want and len(set(want)) > 3
    tokens, logits = MultimodalRunner(path).greedy(ids.numpy(), 32, pixels)
    ref = hf_decode(model, ids, media, 32, forced=tokens)[1]  # HF's cached steps on tract's chain
    assert float(np.abs(np.stack(logits) - ref).max()) < 1e-4 * max(1.0, float(np.abs(ref).max()))
    if images:  # the bidirectional mask matters: HF without it is far from tract
        causal = hf_decode(model, ids, {"pixel_values": pixels}, 1)[1]
        assert float(np.abs(logits[0] - causal[0]).max()) > 1e-2


def test_manifest_and_blocks(gemma3: tuple[Path, Any], exported: tuple[Path, dict[str, Any]]) -> None:
    from transformers.models.gemma3.modeling_gemma3 import get_block_sequence_ids_for_mask

    path, manifest = exported
    assert manifest["architecture"] == "Gemma3ForConditionalGeneration"
    assert (
        manifest["attention"]["kind"] == "image_blocks" and manifest["attention"]["input"] == "image_blocks"
    )
    assert manifest["decoder"]["inputs"][:2] == ["inputs_embeds", "image_blocks"]
    assert manifest["positions"] is None and manifest["media"]["tokens_per_item"] == 16
    assert manifest["vision"]["preprocessing"]["image_processor_type"] == "Gemma3ImageProcessor"
    ids = vlm_models.prompt(gemma3[1], images=2, seed=4)
    want = get_block_sequence_ids_for_mask((ids == vlm_models.IMAGE_TOKEN).long()) + 1
    assert np.array_equal(image_blocks(ids.numpy(), vlm_models.IMAGE_TOKEN), want.numpy())
    assert image_blocks(ids.numpy(), vlm_models.IMAGE_TOKEN).max() == 2
    assert MultimodalRunner(path).mode == "state"  # detect_kv_cache with the blocks input

"""Qwen2.5-VL end to end (issue 31, item 2): Qwen2-VL's decoder and M-RoPE positions, a vision
tower with RMS norms, gated MLPs and windowed attention (block 0 attends within 2 × 2 merged-token
windows of the window-ordered patches, block 1 over the whole image: ``fullatt_block_indexes``),
traced for the one grid the export fixes. ``torchlower.llm.generate`` gives HF ``generate``'s
greedy tokens with one image and two.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests import vlm_models

pytest.importorskip("transformers")
from torchlower import llm
from torchlower.llm.vlm_families import image_grid
from torchlower.llm.vlm_runner import MultimodalRunner


@pytest.fixture(scope="module")
def qwen2_5_vl(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    return vlm_models.qwen2_5_vl_folder(tmp_path_factory.mktemp("qwen2_5_vl") / "hf")


@pytest.fixture(scope="module")
def exported(qwen2_5_vl: tuple[Path, Any]) -> Any:
    return llm.export(qwen2_5_vl[0], qwen2_5_vl[0].parent / "qwen2_5_vl_tract")


@pytest.mark.parametrize("images", [1, 2])
def test_tokens_equal_hf(qwen2_5_vl: tuple[Path, Any], exported: Any, images: int) -> None:
    model = qwen2_5_vl[1]
    assert exported.architecture == "Qwen2_5_VLForConditionalGeneration"
    assert exported.tokens == exported.reference_tokens and exported.logit_error < 1e-3
    ids = vlm_models.prompt(model, images=images, seed=images)
    pixels = vlm_models.qwen2_vl_pixels(model, seed=10 + images, images=images)
    grid = torch.tensor([image_grid(model)] * images)
    media = {"pixel_values": pixels, "image_grid_thw": grid, "mm_token_type_ids": (ids == 150).int()}
    with torch.no_grad():
        out = model.generate(input_ids=ids, **media, max_new_tokens=32, min_new_tokens=32, do_sample=False)
    want = out[0, ids.shape[1] :].tolist()
    assert llm.generate(exported.path, ids, 32, pixel_values=pixels) == want and len(set(want)) > 3


def test_windows_bite(qwen2_5_vl: tuple[Path, Any], exported: Any) -> None:
    """The vision archive equals HF's windowed tower, and is far from the same tower with every
    block attending over the whole image (the test's windows change the features)."""
    model = qwen2_5_vl[1]
    pixels = vlm_models.qwen2_vl_pixels(model, seed=3)
    grid = torch.tensor([image_grid(model)])
    got = MultimodalRunner(exported.path).features(pixels.numpy())
    visual = model.model.visual
    with torch.no_grad():
        want = visual(pixels, grid_thw=grid).pooler_output.numpy()
        visual.fullatt_block_indexes = [0, 1]
        try:
            full = visual(pixels, grid_thw=grid).pooler_output.numpy()
        finally:
            visual.fullatt_block_indexes = list(vlm_models.QWEN2_5_VL_VISION["fullatt_block_indexes"])
    scale = float(np.abs(want).max())
    assert float(np.abs(got - want).max()) < 1e-4 * scale < float(np.abs(full - want).max())

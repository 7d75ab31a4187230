"""Qwen2-VL end to end (issue 31, item 2): multimodal rotary positions (M-RoPE) are a decoder
input, ``position_ids`` [3, 1, S], which the runner computes from the manifest's merged grid
(``llm/mrope.py``); the vision archive is lowered for the one patch grid the export fixes.
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
from torchlower.llm.mrope import mrope_positions
from torchlower.llm.vlm_families import image_grid
from torchlower.llm.vlm_runner import MultimodalRunner

pytestmark = pytest.mark.xdist_group("qwen2_vl")  # one worker exports it once (archive_exports)


@pytest.fixture(scope="module")
def qwen2_vl(exports: Any) -> tuple[Path, Any]:
    return exports.folder("qwen2_vl")


@pytest.fixture(scope="module")
def exported(exports: Any) -> Any:
    return exports.exported("qwen2_vl")


def _media(model: Any, ids: torch.Tensor, pixels: torch.Tensor | None, images: int) -> dict[str, Any]:
    if not images:
        return {}
    grid = torch.tensor([image_grid(model)] * images)
    return {"pixel_values": pixels, "image_grid_thw": grid, "mm_token_type_ids": (ids == 150).int()}


@pytest.mark.parametrize("images", [1, 2, 0])
def test_tokens_equal_hf(qwen2_vl: tuple[Path, Any], exported: Any, images: int) -> None:
    model = qwen2_vl[1]
    assert exported.tokens == exported.reference_tokens and exported.logit_error < 1e-3
    ids = vlm_models.prompt(model, images=images, seed=images)
    pixels = vlm_models.qwen2_vl_pixels(model, seed=10 + images, images=images) if images else None
    media = _media(model, ids, pixels, images)
    with torch.no_grad():
        out = model.generate(input_ids=ids, **media, max_new_tokens=32, min_new_tokens=32, do_sample=False)
    want = out[0, ids.shape[1] :].tolist()
    assert llm.generate(exported.path, ids, 32, pixel_values=pixels) == want and len(set(want)) > 3


def test_positions_equal_hf_rope_index(qwen2_vl: tuple[Path, Any], exported: Any) -> None:
    model = qwen2_vl[1]
    manifest = json.loads((exported.path / "manifest.json").read_text())
    assert manifest["positions"] == {
        "kind": "mrope", "input": "position_ids", "image_grid_thw": [1, 8, 8], "merged_grid": [1, 4, 4]
    }  # fmt: skip
    assert manifest["decoder"]["inputs"][:2] == ["inputs_embeds", "position_ids"]
    ids = vlm_models.prompt(model, images=2, seed=4)
    grid = torch.tensor([image_grid(model)] * 2)
    want, delta = model.model.get_rope_index(ids, mm_token_type_ids=(ids == 150).int(), image_grid_thw=grid)
    got, following = mrope_positions(ids.numpy(), 150, manifest["positions"]["merged_grid"])
    assert np.array_equal(got, want.numpy()) and following == ids.shape[1] + int(delta)
    assert MultimodalRunner(exported.path).mode == "state"  # detect_kv_cache with two feeds

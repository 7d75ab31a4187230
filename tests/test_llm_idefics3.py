"""Idefics3 and SmolVLM end to end (issue 31, item 2, the second VLM): the vision archive holds
the SigLIP-like tower and the pixel-shuffle connector for one tile; ``torchlower.llm.generate``
with the tiles of two images gives HF ``generate``'s greedy tokens (HF takes them as
``pixel_values`` [1, tiles, 3, H, W]).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests import vlm_models

pytest.importorskip("transformers")
from torchlower import llm


@pytest.mark.parametrize(
    "kind", [pytest.param("Idefics3", marks=pytest.mark.xdist_group("idefics3")), "SmolVLM"]
)
def test_tokens_equal_hf_with_two_tiles(tmp_path: Path, kind: str, exports: Any) -> None:
    """Idefics3: the session's export (tests/archive_exports.py); SmolVLM its own."""
    if kind == "Idefics3":
        (folder, model), report = exports.folder("idefics3"), exports.exported("idefics3")
    else:
        folder, model = vlm_models.idefics3_folder(tmp_path / "hf", kind=kind)
        report = llm.export(folder, tmp_path / "tract")
    assert report.tokens == report.reference_tokens and report.logit_error < 1e-3
    manifest = json.loads((report.path / "manifest.json").read_text())
    assert manifest["model_type"] == kind.lower() and manifest["media"]["tokens_per_item"] == 16
    assert manifest["vision"]["inputs"] == {"pixel_values": [1, 3, 32, 32]}
    ids = vlm_models.prompt(model, images=2, seed=2)
    pixels = vlm_models.pixels(model, seed=12, images=2)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, pixel_values=pixels[None], max_new_tokens=32, min_new_tokens=32, do_sample=False
        )
    want = out[0, ids.shape[1] :].tolist()
    assert llm.generate(report.path, ids, 32, pixel_values=pixels) == want and len(set(want)) > 3

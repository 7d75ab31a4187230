"""LLaVA end to end (issue 31, item 2): ``torchlower.llm.export`` of a tiny random
``LlavaForConditionalGeneration`` folder writes an embedding archive, a vision archive (CLIP
tower + projector) and a decoder archive fed embeddings (KV cache as tract state) with a
manifest; ``torchlower.llm.generate(OUT, ids, N, pixel_values=...)`` gives HF ``generate``'s
greedy tokens with one image, two images and none.
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
import torchlower
from torchlower import llm
from torchlower.errors import InvalidArgumentError
from torchlower.llm.vlm import hf_decode
from torchlower.llm.vlm_runner import MultimodalRunner

pytestmark = pytest.mark.xdist_group("llava")  # one worker exports it once (archive_exports)


@pytest.fixture(scope="module")
def llava(exports: Any) -> tuple[Path, Any]:
    return exports.folder("llava")


@pytest.fixture(scope="module")
def exported(exports: Any) -> Any:
    return exports.exported("llava")


def _hf_generate(model: Any, ids: torch.Tensor, n: int, pixels: torch.Tensor | None) -> list[int]:
    media = {} if pixels is None else {"pixel_values": pixels}
    with torch.no_grad():
        out = model.generate(input_ids=ids, **media, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, ids.shape[1] :].tolist()


@pytest.mark.parametrize("images", [1, 2, 0])
def test_f32_tokens_and_logits_equal_hf(llava: tuple[Path, Any], exported: Any, images: int) -> None:
    model = llava[1]
    assert exported.tokens == exported.reference_tokens and exported.logit_error < 1e-3
    assert all(e.ok for e in exported.errors) and exported.encoder.errors
    ids = vlm_models.prompt(model, images=images, seed=images)
    pixels = vlm_models.pixels(model, seed=10 + images, images=images) if images else None
    want = _hf_generate(model, ids, 32, pixels)
    assert llm.generate(exported.path, ids, 32, pixel_values=pixels) == want
    assert len(set(want)) > 3  # a moving chain
    tokens, logits = MultimodalRunner(exported.path).greedy(ids.numpy(), 32, pixels)
    media = {} if pixels is None else {"pixel_values": pixels}
    ref = hf_decode(model, ids, media, 32, forced=tokens)[1]  # HF's cached steps on tract's chain
    error = float(np.abs(np.stack(logits) - ref).max())
    assert error < 1e-4 * max(1.0, float(np.abs(ref).max())), error


def test_manifest_and_archives(exported: Any) -> None:
    """The vision weights live in the vision archive only, the token table in the embedding's."""
    manifest = json.loads((exported.path / "manifest.json").read_text())
    assert manifest["format"] == "torchlower.multimodal_lm" and manifest["max_context"] == 128
    assert manifest["media"] | {"placement": None} == {
        "part": "vision", "input": "pixel_values", "token_id": vlm_models.IMAGE_TOKEN, "tokens_per_item": 16,
        "hidden_size": 32, "placement": None, "mask_input": None, "count_output": None,
    }  # fmt: skip
    vision = manifest["vision"]
    assert vision["inputs"] == {"pixel_values": [1, 3, 16, 16]} and vision["output_shape"] == [1, 16, 32]
    assert vision["preprocessing"]["image_mean"][0] == pytest.approx(0.48145466)
    assert vision["preprocessing"]["crop_size"] == {"height": 16, "width": 16}
    weights = {
        p: torchlower.load(exported.path / f"{p}.nnef.tgz").weights for p in ("embed", "vision", "decoder")
    }
    labels = [w for w in weights["vision"] if not w.startswith("constants/")]  # folded position rows
    assert all("vision_tower" in w or "multi_modal_projector" in w for w in labels)
    assert any("multi_modal_projector" in w for w in labels) and "model.lm_head.weight" in weights["decoder"]
    assert not any("vision_tower" in w or "projector" in w for w in weights["decoder"])
    assert list(weights["embed"]) == ["embed.weight"]
    decoder = torchlower.load(exported.path / "decoder.nnef.tgz")
    assert "tract_assert P + S <= 128" in decoder.graph.extensions
    assert {"config.json", "preprocessor_config.json"} <= set(decoder.bundled)
    assert MultimodalRunner(exported.path).mode == "state"  # detect_kv_cache took every cache


def test_prompt_and_image_checks(llava: tuple[Path, Any], exported: Any) -> None:
    model = llava[1]
    ids = vlm_models.prompt(model, images=1)
    with pytest.raises(InvalidArgumentError, match=r"holds 16 150 tokens .* give 32 feature rows"):
        llm.generate(exported.path, ids, 2, pixel_values=vlm_models.pixels(model, images=2))
    with pytest.raises(InvalidArgumentError, match=r"pixel_values must be float \[n, 3, 16, 16\]"):
        llm.generate(exported.path, ids, 2, pixel_values=np.zeros((1, 3, 8, 8), np.float32))
    with pytest.raises(llm.ContextLengthError, match="P \\+ S <= 128"):
        llm.generate(exported.path, ids, 128 - ids.shape[1] + 2, pixel_values=vlm_models.pixels(model))


def test_f16_exports_and_generates(llava: tuple[Path, Any], tmp_path: Path) -> None:
    report = llm.export(llava[0], tmp_path / "f16", precision="f16")
    assert "float16" in report.decoder.weight_bytes_by_format and all(e.ok for e in report.errors)
    model = llava[1]
    ids, pixels = vlm_models.prompt(model), vlm_models.pixels(model, seed=3)
    tokens = llm.generate(report.path, ids, 32, pixel_values=pixels)
    want = _hf_generate(model, ids, 32, pixels)
    assert len(tokens) == 32 and tokens[:8] == want[:8]
    assert 0 < report.logit_error < 2.0


def test_cli_export_and_unused_weights(
    llava: tuple[Path, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from torchlower.cli.main import main

    code = main(["llm", "export", str(llava[0]), "-o", str(tmp_path / "cli_tract"), "--json"])
    out = capsys.readouterr()
    assert code == 0, out.err[-2000:]
    data = json.loads(out.out)
    assert data["kind"] == "multimodal_lm" and data["tokens"] == data["reference_tokens"]
    assert data["media"]["tokens_per_item"] == 16 and set(data["parts"]) == {"embed", "encoder", "decoder"}
    from safetensors.torch import load_file, save_file

    extra = tmp_path / "extra"
    extra.mkdir()
    for f in llava[0].iterdir():
        (extra / f.name).write_bytes(f.read_bytes())
    weights = load_file(extra / "model.safetensors")
    save_file(
        weights | {"value_head.weight": torch.zeros(2, 2)}, extra / "model.safetensors", {"format": "pt"}
    )
    with pytest.raises(llm.WrongModelError, match=r"value_head\.weight") as err:
        llm.export(extra, tmp_path / "x_tract")
    assert err.value.loaded_class == "LlavaForConditionalGeneration"

"""Qwen2-Audio end to end (issue 31, item 2, the audio LM): ``torchlower.llm.export`` of a tiny
random ``Qwen2AudioForConditionalGeneration`` folder writes an embedding archive, an audio
archive (the Whisper-like encoder, its padding mask and average pool, the projector) and the
decoder fed embeddings; ``torchlower.llm.generate(OUT, ids, N, input_features=...,
feature_attention_mask=...)`` gives HF ``generate``'s greedy tokens for whole and padded audio.
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
from torchlower.errors import InvalidArgumentError
from torchlower.llm.vlm import hf_decode
from torchlower.llm.vlm_runner import MultimodalRunner

pytestmark = pytest.mark.xdist_group("qwen2_audio")  # one worker exports it once (archive_exports)


@pytest.fixture(scope="module")
def qwen2_audio(exports: Any) -> tuple[Path, Any]:
    return exports.folder("qwen2_audio")


@pytest.fixture(scope="module")
def exported(exports: Any) -> Any:
    return exports.exported("qwen2_audio")


@pytest.mark.parametrize("real", [40, 29, 13])  # frames of audio in the 40-frame window
def test_f32_tokens_and_logits_equal_hf(qwen2_audio: tuple[Path, Any], exported: Any, real: int) -> None:
    model = qwen2_audio[1]
    assert exported.tokens == exported.reference_tokens and exported.logit_error < 1e-3
    features, mask = vlm_models.audio_features(model, seed=real, real=real)
    ids = vlm_models.audio_prompt(model, mask, seed=real)
    with torch.no_grad():
        out = model.generate(
            input_ids=ids, input_features=features, feature_attention_mask=mask, max_new_tokens=32,
            min_new_tokens=32, do_sample=False,
        )  # fmt: skip
    want = out[0, ids.shape[1] :].tolist()
    assert llm.generate(exported.path, ids, 32, input_features=features, feature_attention_mask=mask) == want
    assert len(set(want)) > 3
    tokens, logits = MultimodalRunner(exported.path).greedy(ids.numpy(), 32, features, mask)
    media = {"input_features": features, "feature_attention_mask": mask}
    ref = hf_decode(model, ids, media, 32, forced=tokens)[1]  # HF's cached steps on tract's chain
    error = float(np.abs(np.stack(logits) - ref).max())
    assert error < 1e-4 * max(1.0, float(np.abs(ref).max())), error


def test_manifest_and_mask(qwen2_audio: tuple[Path, Any], exported: Any) -> None:
    manifest = json.loads((exported.path / "manifest.json").read_text())
    assert manifest["media"]["part"] == "audio" and manifest["media"]["token_id"] == vlm_models.AUDIO_TOKEN
    assert manifest["media"]["mask_input"] == "feature_attention_mask"
    assert manifest["media"]["count_output"] == "audio_tokens" and manifest["media"]["tokens_per_item"] == 10
    assert manifest["audio"]["inputs"] == {"input_features": [1, 8, 40], "feature_attention_mask": [1, 40]}
    assert MultimodalRunner(exported.path).mode == "state"
    features, mask = vlm_models.audio_features(qwen2_audio[1], real=13)
    ids = vlm_models.audio_prompt(qwen2_audio[1], mask)  # 3 rows of 13 frames
    with pytest.raises(InvalidArgumentError, match=r"holds 3 151 tokens .* give 10 feature rows"):
        llm.generate(exported.path, ids, 2, input_features=features)  # no mask: 40 real frames
    with pytest.raises(InvalidArgumentError, match=r"feature_attention_mask must be 0/1"):
        llm.generate(exported.path, ids, 2, input_features=features, feature_attention_mask=mask[:, :5])

"""Speech2Text end to end (issue 31, item 1): ``torchlower.llm.export`` of a tiny random
``Speech2TextForConditionalGeneration`` folder writes the Whisper layout (encoder archive with
every layer's cross K/V, decoder archive with the self-attention cache as tract state, manifest),
with the encoder's time axis dynamic (any 1..4 * max_source_positions frames, lowered by the
jit front end); ``torchlower.llm.generate`` in tract gives HF ``generate``'s greedy tokens in
f32, f16 and q4_0, also when the chain holds the padding token (fairseq positions).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests import speech_models
from tests.cli_inprocess import run_json

pytest.importorskip("transformers")
import torchlower
from torchlower import llm
from torchlower.errors import InvalidArgumentError
from torchlower.llm.seq2seq import hf_decode
from torchlower.llm.seq2seq_runner import Seq2SeqRunner

START = [2]  # decoder_start_token_id (Speech2Text's end of sentence)
PAD = 1
MAX_FRAMES = 120  # 4 * max_source_positions: two stride-2 convolutions

pytestmark = pytest.mark.xdist_group("speech2text")  # one worker exports it once (archive_exports)


@pytest.fixture(scope="module")
def s2t(exports: Any) -> tuple[Path, Any]:
    return exports.folder("speech2text")


@pytest.fixture(scope="module")
def exported(exports: Any) -> Any:
    return exports.exported("speech2text")


def _hf_generate(model: Any, features: torch.Tensor, n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            features, decoder_input_ids=torch.tensor([START]), max_new_tokens=n, min_new_tokens=n,
            do_sample=False,
        )  # fmt: skip
    return out[0, -n:].tolist()


# (seed, frames): lengths from one frame to the table's last row; seeds 5 and 9 emit the padding
# token, whose position is padding_idx and which later positions do not count
UTTERANCES = [(5, 50), (9, 77), (7, MAX_FRAMES), (6, 13), (8, 1)]


def test_f32_tokens_and_logits_equal_hf_at_every_length(s2t: tuple[Path, Any], exported: Any) -> None:
    model = s2t[1]
    assert exported.model_type == "speech_to_text"
    assert exported.tokens == exported.reference_tokens and exported.logit_error < 1e-4
    assert exported.encoder.errors and all(e.ok for e in exported.errors)
    assert any("T=" in e.name for e in exported.encoder.errors)  # checked at other lengths too
    chains = []
    for seed, frames in UTTERANCES:
        features = speech_models.features(model, seed, frames)
        want = _hf_generate(model, features, 32)
        assert llm.generate(exported.path, START, 32, input_features=features) == want, (seed, frames)
        tokens, logits = Seq2SeqRunner(exported.path).greedy(START, 32, features.numpy())
        ref = hf_decode(model, features, START, 32, forced=tokens)[1]
        error = float(np.abs(np.stack(logits) - ref).max())
        assert error < 1e-4 * max(1.0, float(np.abs(ref).max())), (seed, frames, error)
        chains.append(want)
    assert sum(PAD in chain for chain in chains) >= 2 and max(len(set(c)) for c in chains) > 4
    features = speech_models.features(model, 5, 50)
    with torch.no_grad():  # HF without its cache counts a padding token's followers differently
        full = model(input_features=features, decoder_input_ids=torch.tensor([START + chains[0][:-1]])).logits
    cached = hf_decode(model, features, START, 32, forced=chains[0])[1]
    assert np.abs(full[0].numpy() - cached).max() > 0.1  # so the chains above test the cached positions


def test_archive_layout_and_dynamic_time_axis(exported: Any) -> None:
    manifest = json.loads((exported.path / "manifest.json").read_text())
    assert manifest["model_type"] == "speech_to_text" and manifest["max_context"] == 64
    assert manifest["encoder"]["inputs"]["input_features"] == [1, "T", 8]
    assert manifest["encoder"]["frames"] == {"axis": 1, "min": 1, "max": MAX_FRAMES}
    assert manifest["encoder"]["outputs"] == manifest["decoder"]["cross_inputs"]
    assert manifest["decoder_start_token_id"] == 2
    encoder = torchlower.load(exported.path / "encoder.nnef.tgz")
    decoder = torchlower.load(exported.path / "decoder.nnef.tgz")
    assert encoder.properties["torchlower.llm.part"] == "encoder"
    assert any("conv" in label for label in encoder.weights)
    assert not any("conv" in label or "encoder_attn.k_proj" in label for label in decoder.weights)
    assert "tract_assert P + S <= 64" in decoder.graph.extensions
    runner = Seq2SeqRunner(exported.path)
    assert runner.mode == "state"  # detect_kv_cache took every self cache
    import tract

    nnef = tract.nnef().with_tract_extra().with_tract_transformers()
    assert "T" in str(nnef.load(str(exported.path / "encoder.nnef.tgz")).input_fact(0))  # symbolic time
    for frames in (1, 2, 3, 4, 5, 61, MAX_FRAMES):  # ceil(ceil(T / 2) / 2) encoder positions
        runner.encode(np.zeros((1, frames, 8), np.float32))
        assert runner.cross[0].to_numpy().shape == (1, 2, -(-frames // 4), 8), frames


def test_frames_and_context_bounds(s2t: tuple[Path, Any], exported: Any) -> None:
    """120 frames (the encoder table's last row) and 64 positions run as HF does; one more
    frame or position is refused before tract, as HF's own cached decoding fails there."""
    model = s2t[1]
    features = speech_models.features(model, 7, 100)
    tokens = llm.generate(exported.path, START, 64, input_features=features)
    assert tokens == _hf_generate(model, features, 64)
    with pytest.raises(IndexError):  # HF reads past its sinusoidal table
        _hf_generate(model, features, 65)
    with pytest.raises(llm.ContextLengthError, match=r"65 positions .*P \+ S <= 64"):
        llm.generate(exported.path, START, 65, input_features=features)
    for bad in (np.zeros((1, MAX_FRAMES + 1, 8), np.float32), np.zeros((1, 50, 9), np.float32)):
        with pytest.raises(InvalidArgumentError, match=r"input_features must be float \[1, 1\.\.120, 8\]"):
            llm.generate(exported.path, START, 4, input_features=bad)
    with pytest.raises(InvalidArgumentError, match="max_context=65 exceeds the decoder's 64 positions"):
        llm.export(s2t[0], s2t[0].parent / "too_long", max_context=65)


@pytest.mark.parametrize("options", [{"precision": "f16"}, {"compress": "q4_0"}])
def test_f16_and_q4_0_export_load_generate(
    s2t: tuple[Path, Any], tmp_path: Path, options: dict[str, str]
) -> None:
    report = llm.export(s2t[0], tmp_path / "s", **options)
    formats = {**report.encoder.weight_bytes_by_format, **report.decoder.weight_bytes_by_format}
    assert ("float16" in formats) if "precision" in options else ("q4_0" in formats)
    assert report.encoder.errors and all(e.ok for e in report.errors)  # each part vs PyTorch
    assert report.tokens == report.reference_tokens  # f16: HF in f32; q4_0: HF on the dequantized weights
    model = s2t[1]
    for seed, frames in UTTERANCES[:2]:
        features = speech_models.features(model, seed, frames)
        tokens = llm.generate(report.path, START, 32, input_features=features)
        if "precision" in options:
            assert tokens == _hf_generate(model, features, 32) and 0 < report.logit_error < 0.05
        else:
            assert len(tokens) == 32 and 0 < report.logit_error < 0.5  # q4_0 moves the logits
    for part in ("encoder", "decoder"):
        assert torchlower.load(report.path / f"{part}.nnef.tgz").weights


def test_cli_export(s2t: tuple[Path, Any], tmp_path: Path) -> None:
    """``torchlower llm export`` in process (every command on the parts: test_archive_kinds.py);
    the text shows the encoder's dynamic frames."""
    from rich.console import Console

    from torchlower.cli.llm_cmd import render_seq2seq

    data = run_json("llm", "export", s2t[0], "-o", tmp_path / "cli_tract")
    assert data["kind"] == "speech_seq2seq" and data["tokens"] == data["reference_tokens"]
    assert data["max_context"] == 64 and data["encoder_inputs"] == {"input_features": [1, "T", 8]}
    console = Console(record=True, width=110)
    render_seq2seq(console, data)
    assert "input_features [1, 1..120, 8]" in console.export_text()


def test_end_of_sentence_stops_as_hf(tmp_path: Path) -> None:
    """The generation config's ``eos_token_id`` stops ``generate`` where HF stops (84: a token
    the tiny model's chains emit; real checkpoints use 2, also their start token)."""
    path, model = speech_models.speech2text_folder(tmp_path / "hf", eos_token_id=84)
    report = llm.export(path, tmp_path / "s")
    assert json.loads((report.path / "manifest.json").read_text())["generation"]["eos_token_id"] == [84]
    stopped = 0
    for seed, frames in UTTERANCES:
        features = speech_models.features(model, seed, frames)
        with torch.no_grad():
            want = model.generate(
                features, decoder_input_ids=torch.tensor([START]), max_new_tokens=32, do_sample=False
            )[0, 1:].tolist()
        assert llm.generate(report.path, START, 32, input_features=features) == want, seed
        stopped += want[-1] == 84 and len(want) < 32
    assert stopped >= 2

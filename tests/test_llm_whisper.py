"""Whisper end to end (issue 31, item 1): ``torchlower.llm.export`` of a tiny random
``WhisperForConditionalGeneration`` folder writes an encoder archive (cross K/V of every layer,
computed once) and a decoder archive (self-attention KV cache as tract state, cross K/V as
inputs); ``torchlower.llm.generate(OUT, start_ids, N, input_features=...)`` in tract gives HF
``generate``'s greedy tokens, in f32, f16 and q4_0.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests import speech_models
from tests.cli_inprocess import run, run_json

pytest.importorskip("transformers")
import torchlower
from torchlower import llm
from torchlower.llm.seq2seq_frontend import fit_samples, speechlike, whisper_frontend
from torchlower.llm.seq2seq_runner import Seq2SeqRunner

START = [1]  # decoder_start_token_id of the tiny config

pytestmark = pytest.mark.xdist_group("whisper")  # one worker exports it once (archive_exports)


@pytest.fixture(scope="module")
def whisper(exports: Any) -> tuple[Path, Any]:
    return exports.folder("whisper")


@pytest.fixture(scope="module")
def exported(exports: Any) -> Any:
    return exports.exported("whisper")


def _hf_generate(model: Any, features: torch.Tensor, n: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            features,
            decoder_input_ids=torch.tensor([START]),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
        )
    return out[0, -n:].tolist()


def test_f32_tokens_and_logits_equal_hf(whisper: tuple[Path, Any], exported: Any) -> None:
    model = whisper[1]
    assert exported.tokens == exported.reference_tokens and exported.logit_error < 1e-4
    assert exported.encoder.errors and all(e.ok for e in exported.errors)
    for seed in (5, 6):  # two utterances
        features = speech_models.features(model, seed)
        want = _hf_generate(model, features, 32)
        assert llm.generate(exported.path, START, 32, input_features=features) == want
        assert len(set(want)) > 3  # a moving chain
        tokens, logits = Seq2SeqRunner(exported.path).greedy(START, 32, features.numpy())
        with torch.no_grad():
            ref = model(
                input_features=features, decoder_input_ids=torch.tensor([START + tokens[:-1]])
            ).logits[0]
        error = float(np.abs(np.stack(logits) - ref.numpy()).max())
        assert error < 1e-4 * max(1.0, float(ref.abs().max())), error


def test_archive_layout(exported: Any) -> None:
    """Cross K/V projections live in the encoder archive only; the decoder's self cache is state."""
    manifest = json.loads((exported.path / "manifest.json").read_text())
    assert manifest["format"] == "torchlower.speech_seq2seq" and manifest["max_context"] == 64
    assert manifest["encoder"]["outputs"] == manifest["decoder"]["cross_inputs"]
    assert manifest["encoder"]["outputs"] == ["cross_key_0", "cross_value_0", "cross_key_1", "cross_value_1"]
    encoder = torchlower.load(exported.path / "encoder.nnef.tgz")
    decoder = torchlower.load(exported.path / "decoder.nnef.tgz")
    assert any("encoder_attn.k_proj" in label for label in encoder.weights)
    assert not any(
        "encoder_attn.k_proj" in label or "encoder_attn.v_proj" in label for label in decoder.weights
    )
    assert not any("conv" in label for label in decoder.weights)
    assert "tract_assert P + S <= 64" in decoder.graph.extensions
    assert decoder.properties["torchlower.llm.part"] == "decoder"
    assert "config.json" in decoder.bundled
    assert Seq2SeqRunner(exported.path).mode == "state"  # detect_kv_cache took every self cache
    assert not (exported.path.parent / ".whisper_tract").exists()
    with tarfile.open(exported.path / "decoder.nnef.tgz") as tar:
        assert "graph.nnef" in tar.getnames()


def test_context_bound_one_past(whisper: tuple[Path, Any], exported: Any) -> None:
    """64 positions (the table's rows) decode as HF does; one more is refused before tract.
    (HF's Whisper generate stops one earlier: it counts the last token, which is never fed.)"""
    features = speech_models.features(whisper[1], 7)
    tokens = llm.generate(exported.path, START, 64, input_features=features)  # feeds positions 0..63
    assert len(tokens) == 64 and tokens[:63] == _hf_generate(whisper[1], features, 63)
    with torch.no_grad():  # the 64th from the table's last row, as HF's forward gives it
        last = whisper[1](
            input_features=features, decoder_input_ids=torch.tensor([START + tokens[:63]])
        ).logits
    assert tokens[63] == int(last[0, -1].argmax())
    with pytest.raises(llm.ContextLengthError, match=r"65 positions .*P \+ S <= 64") as err:
        llm.generate(exported.path, START, 65, input_features=features)
    assert err.value.max_context == 64
    with pytest.raises(torchlower.errors.InvalidArgumentError, match="input_features must be float"):
        llm.generate(exported.path, START, 4, input_features=np.zeros((1, 8, 39), np.float32))


@pytest.mark.parametrize("options", [{"precision": "f16"}, {"compress": "q4_0"}])
def test_f16_and_q4_0_export_load_generate(
    whisper: tuple[Path, Any], tmp_path: Path, options: dict[str, str]
) -> None:
    report = llm.export(whisper[0], tmp_path / "w", **options)
    formats = {**report.encoder.weight_bytes_by_format, **report.decoder.weight_bytes_by_format}
    assert ("float16" in formats) if "precision" in options else ("q4_0" in formats)
    assert report.encoder.errors and all(e.ok for e in report.errors)  # each part vs PyTorch
    assert report.tokens == report.reference_tokens  # f16: HF in f32; q4_0: HF on the dequantized weights
    features = speech_models.features(whisper[1], 5)
    tokens = llm.generate(report.path, START, 32, input_features=features)
    want = _hf_generate(whisper[1], features, 32)
    if "precision" in options:
        assert tokens == want and 0 < report.logit_error < 0.2  # measured 0.054
    else:
        assert len(tokens) == 32 and report.logit_error > 0  # q4_0 of std-0.6 weights moves the chain
    for part in ("encoder", "decoder"):
        assert torchlower.load(report.path / f"{part}.nnef.tgz").weights


def test_cli_export(whisper: tuple[Path, Any], tmp_path: Path) -> None:
    """In process (every command on the parts: test_archive_kinds.py)."""
    data = run_json("llm", "export", whisper[0], "-o", tmp_path / "cli_tract")
    assert data["kind"] == "speech_seq2seq" and data["tokens"] == data["reference_tokens"]
    assert data["parts"]["decoder"]["checked"] and data["max_context"] == 64
    refused = run("llm", "export", whisper[0], "-o", tmp_path / "w.nnef.tgz")
    assert refused.returncode == 2 and "folder" in refused.stderr


def test_generate_applies_the_generation_config_as_hf(tmp_path: Path) -> None:
    """``suppress_tokens``, ``begin_suppress_tokens`` and the end-of-text id from the folder's
    generation config: the same tokens as HF's Whisper ``generate``, which applies them."""
    plain = speech_models.whisper()
    features = speech_models.features(plain, 5)
    chain = _hf_generate(plain, features, 32)  # without processors: 84, 55, 91, 55, 9, 9, …, 4
    suppress, first, eos = [9, 42], chain[0], 4
    assert {9, 42, eos} <= set(chain)
    model = speech_models.whisper(suppress_tokens=suppress, begin_suppress_tokens=[first], eos_token_id=eos)
    model.save_pretrained(tmp_path / "hf")
    report = llm.export(tmp_path / "hf", tmp_path / "w")
    assert json.loads((report.path / "manifest.json").read_text())["generation"] == {
        "suppress_tokens": suppress, "begin_suppress_tokens": [first], "eos_token_id": [eos]
    }  # fmt: skip
    with torch.no_grad():
        want = model.generate(
            features, decoder_input_ids=torch.tensor([START]), max_new_tokens=32, do_sample=False,
            return_dict_in_generate=True,
        ).sequences[0, len(START) :].tolist()  # fmt: skip
    tokens = llm.generate(report.path, START, 32, input_features=features)
    assert tokens == want and tokens[-1] == eos and len(tokens) < 32  # stopped at the end of text
    assert not set(tokens) & set(suppress) and tokens[0] != first


def test_q4_0_packs_the_tied_head_apart_from_the_table(tmp_path: Path) -> None:
    """d_model 32 (one Q4_0 block): the head tied to the token table is its own Q4_0 matrix,
    the lookup keeps the f32 table, and the export's check (HF untied on the dequantized head)
    passes with HF's tokens."""
    model = speech_models.whisper(d_model=32)
    model.save_pretrained(tmp_path / "hf")
    report = llm.export(tmp_path / "hf", tmp_path / "w", compress="q4_0")
    assert report.tokens == report.reference_tokens
    with tarfile.open(report.path / "decoder.nnef.tgz") as tar:
        headers = {
            name: tar.extractfile(name).read(128)  # type: ignore[union-attr]
            for name in ("proj_out.weight.dat", "decoder.embed_tokens.weight.dat")
        }
    assert headers["proj_out.weight.dat"][48:52] == bytes([0x40, 0x30, 0x52, 0x54])  # Q4_0 blocks
    assert headers["decoder.embed_tokens.weight.dat"][48:50] == bytes([0, 0])  # float


def test_audio_through_the_bundled_front_end(
    whisper: tuple[Path, Any], exported: Any, exports: Any, tmp_path: Path
) -> None:
    """``export(frontend=True)``: ``generate(audio=...)`` runs front end → encoder → decoder and
    gives HF ``generate``'s tokens on ``WhisperFeatureExtractor(audio).input_features``; the
    tract front end is within 1e-5 of the extractor's numpy features, a short utterance padded
    and a long one trimmed as the extractor does."""
    from transformers import WhisperFeatureExtractor

    model = whisper[1]
    manifest = json.loads((exported.path / "manifest.json").read_text())["frontend"]
    assert manifest["inputs"] == {"audio": [1, 6400]} and manifest["sampling_rate"] == 16000
    assert manifest["mel_filters"] == "preprocessor_config.json" and exported.frontend.errors
    extractor = WhisperFeatureExtractor.from_pretrained(whisper[0])
    runner = Seq2SeqRunner(exported.path)
    for audio in (speechlike(6400, 16000, 3)[:5000], speechlike(9000, 16000, 4)):
        features = extractor(audio, sampling_rate=16000, max_length=6400, return_tensors="pt").input_features
        by_numpy = extractor._np_extract_fbank_features(fit_samples(audio, 6400, "test"), "cpu")
        assert np.abs(runner.features(audio) - by_numpy).max() < 1e-5
        want = _hf_generate(model, features, 32)
        assert llm.generate(exported.path, START, 32, audio=audio) == want and len(set(want)) > 3
    np.savez(tmp_path / "a.npz", audio=audio)
    data = run_json("llm", "generate", exported.path, "--ids", "1", "-n", "32", "--media", tmp_path / "a.npz")
    assert data["tokens"] == want and data["media"] == {"audio": [9000]}
    # no preprocessor_config.json: the config's num_mel_bins with the extractor's defaults, the same bank
    shipped = {"preprocessor_config.json": (whisper[0] / "preprocessor_config.json").read_bytes()}
    fallback = whisper_frontend(model, {}, 40)
    assert fallback.filters_from.startswith("config") and fallback.samples == 6400
    assert torch.equal(fallback.module.filters, whisper_frontend(model, shipped, 40).module.filters)
    bare = tmp_path / "bare"  # an export without the front end
    shutil.copytree(exported.path, bare, ignore=shutil.ignore_patterns("frontend.nnef.tgz"))
    plain = json.loads((bare / "manifest.json").read_text())
    del plain["frontend"]
    (bare / "manifest.json").write_text(json.dumps(plain))
    with pytest.raises(
        torchlower.errors.InvalidArgumentError, match=r"export with frontend=True .*--frontend"
    ):
        llm.generate(bare, START, 4, audio=audio)
    assert llm.generate(bare, START, 4, input_features=features) == want[:4]
    with pytest.raises(torchlower.errors.InvalidArgumentError, match="Whisper's log-mel front end"):
        llm.export(exports.folder("speech2text")[0], tmp_path / "x", frontend=True)

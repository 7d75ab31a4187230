"""``torchlower.llm.export`` exports a checkpoint whole or says what it leaves out (issue 31,
"a ✓ on the wrong model"), and bounds the context by the model's real position tables.

A ``WhisperForConditionalGeneration`` folder loads through ``AutoModelForCausalLM`` as
``WhisperForCausalLM``, which has no encoder and no use for its weights: that is refused with
the class and the unused tensors, unless ``part="decoder"`` asks for the decoder alone; then
its 64-row position table bounds the archive (not the 2048 default), checked one token past it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests import llm_models, speech_models
from tests.cli_inprocess import run

pytest.importorskip("transformers")
from torchlower import llm
from torchlower.llm import stages
from torchlower.llm.runner import Decoder


@pytest.fixture(scope="module")
def whisper(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    return speech_models.whisper_folder(tmp_path_factory.mktemp("whisper") / "hf")


@pytest.fixture(scope="module")
def bart(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """An encoder-decoder torchlower.llm does not export whole: AutoModelForCausalLM gives BartForCausalLM."""
    import transformers

    config = transformers.BartConfig(
        vocab_size=120, d_model=16, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BartForConditionalGeneration(config).eval()
    path = tmp_path_factory.mktemp("bart") / "hf"
    model.save_pretrained(path)
    return path, model


def test_encoder_decoder_folder_refused_naming_class_and_unused_weights(
    bart: tuple[Path, Any], tmp_path: Path
) -> None:
    out = tmp_path / "b.nnef.tgz"
    with pytest.raises(llm.WrongModelError) as err:
        llm.export(bart[0], out)
    e = err.value
    assert e.config_class == "BartForConditionalGeneration" and e.loaded_class == "BartForCausalLM"
    encoder = sorted(k for k, _ in bart[1].named_parameters() if k.startswith("model.encoder.layers."))
    assert encoder and set(encoder) <= set(e.unused)
    assert not any(k.startswith("model.decoder.layers.") for k in e.unused)
    message = str(e)
    assert str(bart[0]) in message and "model.encoder.layers.0.fc1" in message and "--part decoder" in message
    assert not out.exists()
    proc = run("llm", "export", bart[0], "-o", out)  # the CLI's entry point, in process
    assert proc.returncode != 0 and "BartForConditionalGeneration" in proc.stderr
    assert "--part decoder" in proc.stderr and not out.exists()


def test_unused_checkpoint_tensor_refused(tmp_path: Path) -> None:
    """The right class, but a tensor the model does not take (a head someone added)."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "hf"
    llm_models.build("llama").save_pretrained(folder)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.value_head.weight"] = torch.zeros(1, 32)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(
        llm.WrongModelError, match=r"1 checkpoint tensor\(s\).*model\.value_head\.weight"
    ) as err:
        llm.export(folder, tmp_path / "o.nnef.tgz")
    assert err.value.unused == ["model.value_head.weight"] and err.value.config_class == "LlamaForCausalLM"


def test_part_decoder_bounded_by_its_position_table(whisper: tuple[Path, Any], tmp_path: Path) -> None:
    import transformers

    report = llm.export(whisper[0], tmp_path / "dec.nnef.tgz", part="decoder")
    assert report.part == "decoder" and report.max_context == 64  # max_target_positions, 64 rows
    assert "model.encoder.conv1.weight" in report.unused_weights
    assert report.properties["torchlower.llm.part"] == "decoder"
    assert report.errors and all(e.ok for e in report.errors)
    hf = transformers.WhisperForCausalLM.from_pretrained(whisper[0]).eval()
    ids = torch.randint(0, 120, (1, 64), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = hf(ids).logits[0, -1].numpy()
    decoder = Decoder(report.path)
    got = decoder.step(ids.numpy())  # all 64 rows of the position table
    assert np.abs(got - want).max() < 1e-4 * max(1.0, float(np.abs(want).max()))
    with pytest.raises(llm.ContextLengthError, match=r"65 positions .*P \+ S <= 64"):
        decoder.step(np.array([[5]]))  # one token past the table
    prompt = ids[:, :5]
    tokens = llm.generate(report.path, prompt, 60)  # 5 + 59 fed back = 64 positions
    with torch.no_grad():
        ref = hf.generate(prompt, max_new_tokens=60, min_new_tokens=60, do_sample=False)
    assert tokens == ref[0, 5:].tolist() and len(set(tokens)) > 3
    with pytest.raises(llm.ContextLengthError) as err:
        llm.generate(report.path, prompt, 61)
    assert (err.value.needed, err.value.max_context) == (65, 64)


@pytest.mark.parametrize("name", sorted(llm_models.CONFIGS))
def test_context_bound_from_the_config_and_position_tables(name: str) -> None:
    model = llm_models.build(name)
    config = model.config.get_text_config(decoder=True)
    limit, why = stages.max_positions(config, model)
    tables = stages.position_tables(model)
    if name == "bloom":  # ALiBi computed for any length: no field, no table
        assert (limit, tables) == (None, [])
        return
    assert limit == 128, (name, why)
    want_tables = {
        "gpt2": "transformer.wpe has 128 rows",
        "opt": "model.decoder.embed_positions has 130 rows less its offset 2",
    }
    assert [w for _, w in tables] == ([want_tables[name]] if name in want_tables else [])


def test_a_table_smaller_than_the_config_bounds_the_context() -> None:
    model = llm_models.build("gpt2")
    model.transformer.wpe = torch.nn.Embedding(100, 32)
    assert stages.max_positions(model.config, model) == (100, "transformer.wpe has 100 rows")

"""What users of the reference exporter expect beside the main path: ``logits_to_keep`` as a runtime
input, bfloat16 checkpoints, tract's prefill/decode scenarios, and why q4_0 leaves a matrix float."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests import llm_models
from torchlower import llm
from torchlower.errors import InvalidArgumentError
from torchlower.llm.runner import Decoder

pytest.importorskip("transformers")
PROMPT = torch.tensor([[3, 17, 42, 9, 101]])


@pytest.fixture(scope="module")
def keep(tmp_path_factory: pytest.TempPathFactory) -> tuple[llm.ExportReport, object]:
    model = llm_models.build("llama")
    return llm.export(model, tmp_path_factory.mktemp("keep") / "k.nnef", logits="keep"), model


def test_logits_to_keep_is_a_runtime_input(keep: tuple[llm.ExportReport, object]) -> None:
    """The last input ``logits_to_keep`` [K] picks the rows; the LM head runs on those only."""
    report, model = keep
    graph = (report.path / "graph.nnef").read_text()
    assert "logits_to_keep = tract_core_external(shape = [K], datum_type = 'i64');" in graph
    assert all(e.ok for e in report.errors) and report.logit_error < 1e-4  # K = 3, 2, 1 vs HF
    decoder = Decoder(report.path)
    assert decoder.mode == "state" and decoder.keeps  # the caches become state, K stays an input
    decoder.step(PROMPT.numpy())
    drafts = np.array([[5, 6, 7, 8]])
    with torch.no_grad():
        want = model(torch.cat([PROMPT, torch.from_numpy(drafts)], 1)).logits[0].numpy()  # type: ignore[operator]
    for k in (3, 1):  # a verification step of k positions, then on the grown cache
        got = decoder.last_logits(drafts, k)
        assert got.shape == (k, 160) and np.abs(got - want[-k:]).max() < 1e-4 * np.abs(want).max()
        decoder.reset()
        decoder.step(PROMPT.numpy())
    assert llm.generate(report.path, PROMPT, 32) == llm_models.greedy(model, PROMPT, 32)


def test_bf16_checkpoint_exports_as_f32_and_f16_with_a_note(tmp_path: Path) -> None:
    import transformers

    llm_models.build("qwen2").to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    widened = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "bf16", dtype=torch.float32)
    f32 = llm.export(tmp_path / "bf16", tmp_path / "f32.nnef")
    assert f32.notes == ["checkpoint weights stored as bfloat16; exported as f32 (exact)"]
    assert llm.generate(f32.path, PROMPT, 32) == llm_models.greedy(widened.eval(), PROMPT, 32)
    f16 = llm.export(tmp_path / "bf16", tmp_path / "f16.nnef", precision="f16")
    (note,) = f16.notes
    assert note.startswith("checkpoint weights stored as bfloat16; exported as f16: rounded from bfloat16")
    assert "0 weight(s) beyond that range become inf" in note and all(e.ok for e in f16.errors)
    with pytest.raises(InvalidArgumentError, match=r"pass model.float\(\)"):
        llm.export(widened.to(torch.bfloat16), tmp_path / "m.nnef")


def test_tract_reads_the_prefill_and_decode_scenarios(
    keep: tuple[llm.ExportReport, object], tmp_path: Path
) -> None:
    """``tg: S == 1`` and ``pp: P == 0`` are declared; tract parses them (a malformed one fails
    to load) and runs every P, S the check covers (P = 6, S = 3 is in neither scenario)."""
    import tract

    graph = (keep[0].path / "graph.nnef").read_text()
    assert "extension tract_assert tg: S == 1;\nextension tract_assert pp: P == 0;" in graph
    broken = tmp_path / "broken.nnef"
    shutil.copytree(keep[0].path, broken)
    (broken / "graph.nnef").write_text(graph.replace("tg: S == 1", "tg: S =="))
    with pytest.raises(Exception, match="Failed to parse"):  # tract's own error
        tract.nnef().with_tract_extra().with_tract_transformers().load(str(broken))


def test_q4_0_gives_a_reason_for_every_float_matrix(tmp_path: Path) -> None:
    config = llm_models.CONFIGS["llama"]()
    config.hidden_size, config.intermediate_size = 48, 64  # rows of 48: not whole Q4_0 blocks
    report = llm.export(llm_models.from_config(config), tmp_path / "q.nnef", compress="q4_0", check=False)
    left = report.unquantized
    assert left["model.layers.0.self_attn.q_proj.weight"] == "reduced size 48 is not a multiple of 32"
    assert "model.layers.0.mlp.down_proj.weight" not in left  # 64 columns: packed
    assert left["model.embed_tokens.weight"].startswith("token embedding table: embeddings='f32'")
    assert left["model.rotary_emb._torchlower_cos"].startswith("not a checkpoint parameter")
    from torchlower.nnef import dat

    for member in report.path.glob("*.dat"):  # every float matrix in the archive is listed
        array = dat.decode(member.read_bytes()) if member.read_bytes()[50:52] != b"RT" else None
        if array is not None and sum(d > 1 for d in array.shape) >= 2:
            assert member.name.removeprefix("model.").removesuffix(".dat") in left, member.name

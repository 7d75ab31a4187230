"""``torchlower.llm``: a tiny Llama exported with its KV cache, decoded in tract like HF generates.

One export (a ``save_pretrained`` folder, with I/O samples) serves every test here; the CLI
test exports the same folder again and must write the same bytes.
"""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests import llm_models
from tests.test_cli import cli_json

pytest.importorskip("transformers")
from torchlower import llm
from torchlower.errors import InvalidArgumentError

pytestmark = pytest.mark.xdist_group("llama")  # one worker exports it once (archive_exports)


@pytest.fixture(scope="module")
def folder(exports: Any) -> tuple[Path, Any]:
    return exports.folder("llama")


@pytest.fixture(scope="module")
def exported(exports: Any) -> llm.ExportReport:
    return exports.exported("llama")


def test_check_covers_prefill_past_and_decode(exported: llm.ExportReport) -> None:
    labels = {e.name.split(" (")[1] for e in exported.errors}
    assert labels == {"prefill P=0)", "with past P=6)", "decode P=9)"}
    assert len(exported.errors) == 3 * (1 + 2 * exported.layers)
    assert all(e.ok for e in exported.errors) and exported.logit_error < 1e-4


@pytest.mark.parametrize("kv", ["state", "explicit"])
def test_greedy_tokens_equal_hf_generate(
    folder: tuple[Path, Any], exported: llm.ExportReport, kv: str
) -> None:
    model = folder[1]
    prompt = torch.tensor([[3, 17, 42, 9, 101]])
    want = llm_models.greedy(model, prompt, 40)
    got = llm.generate(exported.path, prompt, 40, kv=kv)
    assert got == want
    assert len(set(want)) > 3  # a chain that moves, not one token repeated


def test_graph_io_follows_tract_kv_cache_convention(exported: llm.ExportReport) -> None:
    import tract

    nnef = tract.nnef().with_tract_extra().with_tract_transformers()
    model = nnef.load(str(exported.path))
    names = [model.input_name(i) for i in range(model.input_count())]
    outs = [model.output_name(i) for i in range(model.output_count())]
    assert names == ["input_ids", "in_cache_key_0", "in_cache_value_0", "in_cache_key_1", "in_cache_value_1"]
    assert outs == ["outputs", "out_cache_key_0", "out_cache_value_0", "out_cache_key_1", "out_cache_value_1"]
    assert str(model.input_fact(0)) == "1,S,i64" and str(model.input_fact(1)) == "1,2,P,8,f32"
    assert int(model.property("torchlower.llm.parameters").to_numpy()) == exported.parameters
    model.transform("detect_kv_cache")  # every cache becomes tract state: only the ids remain
    assert model.input_count() == 1 and model.output_count() == 1


def test_bundle_and_io_samples_run_in_tract(folder: tuple[Path, Any], exported: llm.ExportReport) -> None:
    import tract

    with tarfile.open(exported.path) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert files["config.json"] == (folder[0] / "config.json").read_bytes()
    graph = files["graph.nnef"].decode()
    assert "extension tract_assert P + S <= 128;" in graph and "tract_core_properties" in graph
    assert "_torchlower_cos" in graph and " sin(" not in graph  # rotary from tables (llm/rope.py)
    runnable = (
        tract.nnef().with_tract_extra().with_tract_transformers().load(str(exported.path)).into_runnable()
    )
    for name in ("io/prompt.npz", "io/prompt_with_past.npz", "io/decode_step.npz"):
        sample = np.load(io.BytesIO(files[name]))
        inputs = [sample[k] for k in ("input_ids", "in_cache_key_0", "in_cache_value_0", "in_cache_key_1",
                                      "in_cache_value_1")]  # fmt: skip
        got = runnable.run(inputs)
        for key, value in zip(("outputs", "out_cache_key_0"), got, strict=False):
            assert np.abs(value.to_numpy() - sample[key]).max() < 1e-4
    assert np.load(io.BytesIO(files["io/prompt.npz"]))["in_cache_key_0"].shape[2] == 0  # P = 0
    generation = np.load(io.BytesIO(files["io/generation.npz"]))
    assert llm.generate(exported.path, generation["input_ids"], 16) == generation["tokens"][0].tolist()


def test_cli_export_is_byte_identical(folder: tuple[Path, Any], exported: llm.ExportReport) -> None:
    again = exported.path.with_name("again.nnef.tgz")
    data = cli_json("llm", "export", folder[0], "-o", again, "--io-samples", "--no-check")
    assert data["ok"] and data["model_type"] == "llama" and not data["checked"]
    assert "io/generation.npz" in data["bundled"]
    assert again.read_bytes() == exported.path.read_bytes()


def test_cli_q4_0_with_lm_head_apart(
    folder: tuple[Path, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In-process (the subprocess CLI is covered above): the table options reach the export."""
    import json

    from torchlower.cli import main

    args = ["llm", "export", str(folder[0]), "-o", str(tmp_path / "q.nnef.tgz"), "--compress", "q4_0"]
    assert main([*args, "--lm-head", "f16", "--no-check", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["embeddings"], data["lm_head"]) == ("f32", "f16")
    left = data["unquantized"]  # every float matrix of a q4_0 archive, with its reason
    assert left["lm_head.weight"] == "LM head: lm_head='f16'; lm_head='q4_0' packs it"
    assert left["model.embed_tokens.weight"].startswith("token embedding table: embeddings='f32'")
    assert set(left) == {"lm_head.weight", "model.embed_tokens.weight", "model.rotary_emb._torchlower_cos",
                         "model.rotary_emb._torchlower_sin"}  # fmt: skip
    formats = data["weight_bytes_by_format"]
    assert formats["q4_0"] > 0 and formats["float16"] == 160 * 32 * 2  # the LM head alone


def test_rotary_tables_reproduce_the_module_and_are_removed(folder: tuple[Path, Any]) -> None:
    from torchlower.llm import rope

    rotary = folder[1].model.rotary_emb
    positions = torch.tensor([[0, 5, 77, 127]])
    want = rotary(torch.zeros(1, 1), positions)
    with rope.rotary_tables(folder[1], 128) as patched:
        got = rotary(torch.zeros(1, 1), positions)
    # exact by construction: the tables are the module's own cos / sin of the same products
    # (inv_freq × position: one multiply each, no sum, whatever the matmul's shape), and torch's
    # elementwise cos / sin give a value the same result wherever it sits in a tensor (where
    # they would not, rope.rotary_tables keeps no table: `patched == 1` fails, visibly)
    assert patched == 1 and all(torch.equal(w, g) for w, g in zip(want, got, strict=True))
    assert "forward" not in vars(rotary) and not hasattr(rotary, "_torchlower_cos")
    with rope.rotary_tables(folder[1], 1 << 20) as patched:  # table beyond TABLE_LIMIT: computed
        assert patched == 0


def test_generate_refuses_token_ids_outside_the_vocabulary(
    folder: tuple[Path, Any], exported: llm.ExportReport
) -> None:
    """tract's Gather panics on an out-of-range id and aborts the process: generate checks first."""
    vocab = folder[1].config.vocab_size
    for bad in (vocab, -1):
        with pytest.raises(InvalidArgumentError, match=rf"token id {bad} is outside the vocabulary"):
            llm.generate(exported.path, [1, 2, bad], 2)
    assert len(llm.generate(exported.path, [1, 2, vocab - 1], 2)) == 2


def _guard_selects(archive: Path) -> int:
    """``select(alive, out, 0.0)`` lines: the SDPA empty-row guards (the mask's select fills -inf)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("graph.nnef")
        assert member is not None
        graph = member.read().decode()
    return sum(1 for line in graph.splitlines() if " = select(" in line and line.endswith(", 0.0);"))


def test_last_layer_guard_dropped_with_the_same_numbers(
    folder: tuple[Path, Any], exported: llm.ExportReport, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """logits='last': only the last layer loses its empty-row guard (llm/last_row.py), and tract
    gives the same logits and caches as the export that keeps it, prefill and decode."""
    import tract

    from torchlower.llm import stages  # the stage that drops the guard

    monkeypatch.setattr(stages, "drop_last_guard", lambda builder: False)
    kept = llm.export(folder[0], tmp_path / "kept.nnef.tgz", check=False).path
    assert (_guard_selects(exported.path), _guard_selects(kept)) == (exported.layers - 1, exported.layers)
    nnef = tract.nnef().with_tract_extra().with_tract_transformers()
    runs = [nnef.load(str(p)).into_runnable() for p in (exported.path, kept)]
    rng = np.random.default_rng(0)
    for past, seq in ((0, 7), (7, 1), (5, 3)):
        caches = [rng.standard_normal((1, 2, past, 8)).astype(np.float32) for _ in range(2 * exported.layers)]
        feeds = [rng.integers(0, 160, (1, seq)).astype(np.int64), *caches]
        got, want = ([t.to_numpy() for t in r.run(feeds)] for r in runs)
        for g, w in zip(got, want, strict=True):
            err = float(np.abs(g - w).max())
            assert g.shape == w.shape and err <= 1e-6 * max(1.0, float(np.abs(w).max())), (past, seq, err)

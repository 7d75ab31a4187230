"""f16 and Q4_0 LLM exports: checked against HF, the cache stays tract state, generation runs.

f16 keeps the cache inputs/outputs f16 (so ``detect_kv_cache`` still sees input → concat →
output); Q4_0 packs the linear layers, and ``embeddings="q4_0"`` the embedding table / LM head.
Logit errors against the original f32 model are reported (``logit_error``), not bounded: they
measure the format, not a bug. The check itself compares with HF running the same weights.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests import llm_models

pytest.importorskip("transformers")
from torchlower import llm
from torchlower.llm.runner import Decoder

PROMPT = torch.tensor([[3, 17, 42, 9, 101]])


@pytest.mark.parametrize("name", ["llama", "mistral", "bloom"])
def test_f16_cache_state_and_generation(name: str, tmp_path: Path) -> None:
    model = llm_models.build(name)
    report = llm.export(model, tmp_path / "m.nnef.tgz", precision="f16", max_context=64)
    assert report.errors and all(e.ok for e in report.errors)
    assert 0 < report.logit_error < 3e-2 * 20
    assert report.weight_bytes_by_format.get("float16", 0) > 0.9 * report.weight_bytes
    decoder = Decoder(report.path)
    assert decoder.mode == "state" and decoder.dtypes[0].__name__ == "float16"
    tokens = llm.generate(report.path, PROMPT, 16)
    want = llm_models.greedy(model, PROMPT, 16)
    assert tokens[:4] == want[:4]  # f16 may part from the f32 chain later, not at once


def test_q4_0_linear_and_embeddings(tmp_path: Path) -> None:
    model = llm_models.build("qwen2")  # tied embedding: gather and LM head share one table
    plain = llm.export(model, tmp_path / "a.nnef.tgz", compress="q4_0")
    assert plain.errors and all(e.ok for e in plain.errors) and plain.max_abs_error < 1e-3
    assert plain.weight_bytes_by_format["q4_0"] > 0 and plain.original_errors
    assert len(llm.generate(plain.path, PROMPT, 8)) == 8
    model = llm_models.build("llama")  # untied: the embedding and LM head can be packed too
    # unchecked, the writer packs each tensor as it writes it (quant.DeferredBlocks)
    linear = llm.export(model, tmp_path / "b.nnef.tgz", compress="q4_0", check=False)
    both = llm.export(model, tmp_path / "c.nnef.tgz", compress="q4_0", embeddings="q4_0")
    assert both.errors and all(e.ok for e in both.errors)
    assert both.weight_bytes_by_format["q4_0"] > linear.weight_bytes_by_format["q4_0"]
    assert both.weight_bytes < linear.weight_bytes < 0.6 * 4 * model.num_parameters()
    # the linear layers' blocks packed at write time = packed ahead for the checked export
    deferred, ahead = _members(linear.path), _members(both.path)
    blocks = [n for n in deferred if n.endswith("proj.weight.dat") and deferred[n][48:50] == b"\x40\x30"]
    assert blocks and all(deferred[n] == ahead[n] for n in blocks)


def test_f16_embeddings_in_f32_graph(tmp_path: Path) -> None:
    model = llm_models.build("llama")
    report = llm.export(model, tmp_path / "e.nnef.tgz", embeddings="f16")
    assert report.errors and all(e.ok for e in report.errors)  # vs HF with f16-rounded tables
    tables = 2 * 160 * 32 * 2  # embedding + LM head, f16
    assert report.weight_bytes_by_format["float16"] == tables
    assert llm.generate(report.path, PROMPT, 16) == llm_models.greedy(model, PROMPT, 16)


def test_f16_with_f32_parts(tmp_path: Path) -> None:
    """attention + norms (the default) and the LM head run in f32 inside the f16 graph; the
    caches stay f16 graph I/O, so tract still keeps them as state."""
    from torchlower.errors import InvalidArgumentError

    model = llm_models.build("gpt2")  # LayerNorm with bias, attention in its own module
    pure = llm.export(model, tmp_path / "p.nnef.tgz", precision="f16", f32_parts=(), max_context=32)
    mixed = llm.export(
        model, tmp_path / "m.nnef.tgz", precision="f16", f32_parts=("attention", "norms", "lm_head"),
        max_context=32,
    )  # fmt: skip
    for report in (pure, mixed):
        assert report.errors and all(e.ok for e in report.errors)
        assert Decoder(report.path).mode == "state"
    assert mixed.properties["torchlower.llm.f32_parts"] == "attention,norms,lm_head"
    graph = _graph(mixed.path)
    assert "ln_f_weight_f32 = tract_core_cast(" in graph and "lm_head" in graph.split("_f32 = ")[-1]
    assert "_f32 = tract_core_cast(" not in _graph(pure.path)
    assert mixed.logit_error < pure.logit_error  # 1.3e-2 vs 2.4e-2 (f16 sums lose more)
    assert llm.generate(mixed.path, PROMPT, 8) == llm_models.greedy(model, PROMPT, 8)
    with pytest.raises(InvalidArgumentError, match="f32_parts"):
        llm.export(model, tmp_path / "x.nnef.tgz", f32_parts=("norms",))  # f32 export
    assert not (tmp_path / "x.nnef.tgz").exists()


def _members(path: Path) -> dict[str, bytes]:
    import tarfile

    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]


def _graph(path: Path) -> str:
    import tarfile

    with tarfile.open(path) as tar:
        return tar.extractfile("graph.nnef").read().decode()  # type: ignore[union-attr]

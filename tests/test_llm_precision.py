"""f16 and Q4_0 LLM exports: checked against HF, the cache stays tract state, generation runs.

f16 keeps the cache inputs/outputs f16 (so ``detect_kv_cache`` still sees input → concat →
output); Q4_0 packs the linear layers, and ``embeddings="q4_0"`` the embedding table / LM head.
Logit errors against the original f32 model are reported (``logit_error``), not bounded: they
measure the format, not a bug. The check itself compares with HF running the same weights.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests import llm_models

pytest.importorskip("transformers")
from torchlower import llm
from torchlower.llm.runner import Decoder

PROMPT = torch.tensor([[3, 17, 42, 9, 101]])


ARCHITECTURES = [
    "llama",
    "qwen2",
    "mistral",
    "phi3",
    "phi",
    "gemma",
    "gpt2",
    "gpt_neox",
    "opt",
    "falcon",
    "bloom",
]


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_f16_every_architecture(name: str, tmp_path: Path) -> None:
    """f16 weights, compute and cache: within 3 % of the largest HF f32 logit on the three
    checked inputs, cache kept as tract state, and the state run = tract's explicit-cache run."""
    model = llm_models.build(name)
    report = llm.export(model, tmp_path / "m.nnef.tgz", precision="f16", max_context=32)
    assert report.errors and all(e.ok for e in report.errors)  # vs HF f32, F16_TOLERANCE
    assert 0 < report.logit_error < 3e-2 * _logit_scale(model)
    assert report.weight_bytes_by_format.get("float16", 0) > 0.9 * report.weight_bytes
    decoder = Decoder(report.path)
    assert decoder.mode == "state" and decoder.dtypes[0].__name__ == "float16"
    tokens = llm.generate(report.path, PROMPT, 8)
    assert tokens == llm.generate(report.path, PROMPT, 8, kv="explicit")
    assert tokens[:4] == llm_models.greedy(model, PROMPT, 4)  # f16 may part from f32 later, not at once


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_q4_0_every_architecture(name: str, tmp_path: Path) -> None:
    """Every linear layer and the LM head in Q4_0 (nothing asked for left float, Falcon's fused
    query_key_value included); tract = HF running the dequantized weights to 1e-3 of the
    largest logit; the state run = tract's explicit-cache run."""
    model = llm_models.build(name)
    report = llm.export(model, tmp_path / "q.nnef.tgz", compress="q4_0", max_context=32)
    assert report.errors and all(e.ok for e in report.errors)
    assert report.max_abs_error < 1e-3 * _logit_scale(model)
    assert report.lm_head == "q4_0" and report.embeddings == "f32"
    # float by policy only: the embedding table (embeddings='f32') and tables the export computed
    embedding = next(n for n, p in model.named_parameters() if p is model.get_input_embeddings().weight)
    assert report.unquantized.pop(embedding).startswith("token embedding table: embeddings='f32'")
    assert all(why.startswith("not a checkpoint parameter") for why in report.unquantized.values())
    linear = [p for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n and "wte" not in n
              and "wpe" not in n and "word_embeddings" not in n]  # fmt: skip
    assert report.weight_bytes_by_format["q4_0"] >= sum(p.numel() for p in linear) // 32 * 18
    table = model.get_input_embeddings().weight.numel() * 4
    assert report.weight_bytes_by_format["float32"] < table + 16_000  # the table, norms, rotary
    assert report.original_errors and 0 < report.logit_error < float("inf")  # measured: the format's error
    tokens = llm.generate(report.path, PROMPT, 8)
    assert tokens == llm.generate(report.path, PROMPT, 8, kv="explicit")
    assert Decoder(report.path).mode == "state"


def _logit_scale(model: torch.nn.Module) -> float:
    with torch.no_grad():
        return float(model(PROMPT).logits.abs().max())


def test_q4_0_linear_and_embeddings(tmp_path: Path) -> None:
    """The embedding table packed too (``embeddings="q4_0"``); blocks packed at write time
    (unchecked) are the bytes packed ahead for the check."""
    model = llm_models.build("llama")
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
    # defaults: the LM head in Q4_0 like the linears, the embedding table f32 (the reference's)
    q4 = {n for n, blob in deferred.items() if blob[48:50] == b"\x40\x30"}
    assert "model.lm_head.weight.dat" in q4 and "model.model.embed_tokens.weight.dat" not in q4
    assert (linear.embeddings, linear.lm_head, both.embeddings) == ("f32", "q4_0", "q4_0")
    assert ahead["model.model.embed_tokens.weight.dat"][48:50] == b"\x40\x30"


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
    # the pure graph widens only its max / min reductions (guards.wide_extrema: an all -inf row)
    widened = re.findall(r"(\w+_f32) = tract_core_cast\(", _graph(pure.path))
    assert all(re.search(rf"(max|min)_reduce\({w}\b", _graph(pure.path)) for w in widened), widened
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

"""Every supported architecture, tiny and random: export checked against HF, then 32 greedy
tokens in tract equal to HF ``generate`` (f32).

What each one covers beyond Llama (tests/test_llm_export.py): Qwen2 tied embeddings + GQA,
Mistral MQA + a sliding window shorter than the sequence, Phi-3 full rotary (an empty
pass-through slice), Phi and GPT-NeoX partial rotary, Gemma a head_dim apart from hidden/heads
+ MQA, GPT-2 and OPT learned positions, Falcon MQA + rotary, Falcon ALiBi (its bias from a
table, ``llm/alibi.py``), Bloom ALiBi (baddbmm), MPT ALiBi (a ``max_seq_len`` table sliced
with ``torch.sym_max`` of sizes, which also bounds the context), Mixtral and Qwen2-MoE
(every expert on every token, weighted by the router: ``llm/moe.py``), DeepSeek-V3's MLA (a
latent cache; tract 0.23.9 fails to load it without ``guards_matmul.broadcast_as_product``), Llama
with dynamic-NTK RoPE (traced below its rescaling point), Phi-3 longrope (32 tokens cross its
switch at 16 positions: the long-factor table, and the cache recomputed as HF's generate does).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests import llm_models

pytest.importorskip("transformers")
from torchlower import llm
from torchlower.llm import stages
from torchlower.llm.runner import Decoder

ARCHITECTURES = [
    "qwen2", "mistral", "phi3", "phi", "gemma", "gpt2", "gpt_neox", "opt", "falcon", "falcon_alibi",
    "bloom", "mpt", "llama_dynamic_rope", "phi3_longrope", "mixtral", "qwen2_moe", "deepseek_v3",
]  # fmt: skip
# tract 0.23.9's detect_kv_cache leaves DeepSeek's rotary-key cache ([1, 1, P, 4], the new rows
# a concat of the rotated halves) as an input: generate passes that cache explicitly
EXPLICIT_KV = {"deepseek_v3"}
SEEDS = {"falcon_alibi": 1}  # seed 0 gives a 2-token chain there
PROMPT = torch.tensor([[3, 17, 42, 9, 101]])


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_tokens_equal_hf(name: str, tmp_path: Path) -> None:
    model = llm_models.build(name, SEEDS.get(name, 0))
    report = llm.export(model, tmp_path / f"{name}.nnef.tgz")
    assert report.errors and all(e.ok for e in report.errors)
    assert report.logit_error < 1e-4 * max(1.0, _logit_scale(model))
    want = llm_models.greedy(model, PROMPT, 32)
    assert llm.generate(report.path, PROMPT, 32) == want
    # state: detect_kv_cache saw every cache (Phi / GPT-NeoX thanks to llm/kv_pattern.py)
    assert Decoder(report.path).mode == ("explicit" if name in EXPLICIT_KV else "state")
    assert len(set(want)) > 3  # the chain moves: a repeated token would hide errors
    tables = _matrices(report.path)  # a tied embedding is stored once (llm.compress.share_tied_table)
    assert len(set(tables.values())) == len(tables), sorted(tables)
    # the bound is the model's own (config field, learned table rows), and one token past it is refused
    limit = stages.max_positions(model.config.get_text_config(decoder=True), model)[0]
    assert report.max_context <= (limit or stages.UNBOUNDED_CONTEXT)
    fits = report.max_context - PROMPT.shape[1] + 1  # prompt + fits - 1 == max_context
    with pytest.raises(llm.ContextLengthError, match=rf"{report.max_context + 1} positions"):
        llm.generate(report.path, PROMPT, fits + 1)


def test_mpt_context_bounded_by_its_alibi_table(tmp_path: Path) -> None:
    """MPT's bias table has ``max_seq_len`` rows: beyond them its add would not broadcast."""
    from torchlower.errors import InvalidArgumentError

    with pytest.raises(InvalidArgumentError, match=r"exceeds the model's 128 positions.*max_seq_len"):
        llm.export(llm_models.build("mpt"), tmp_path / "mpt.nnef.tgz", max_context=129)
    assert not (tmp_path / "mpt.nnef.tgz").exists()


def test_moe_experts_dense_only_while_tracing(tmp_path: Path) -> None:
    """The dense forward is installed on the expert modules for the trace and removed after,
    and the check compared tract with HF's own sparse forward."""
    from torchlower.llm.moe import dense_experts

    model = llm_models.build("mixtral")
    experts = [m for m in model.modules() if type(m).__name__ == "MixtralExperts"]
    with dense_experts(model) as count:
        assert count == len(experts) == 2 and all("forward" in vars(m) for m in experts)
    assert not any("forward" in vars(m) for m in experts)
    report = llm.export(model, tmp_path / "mixtral.nnef.tgz")
    assert report.errors and all(e.ok for e in report.errors)
    assert not any("forward" in vars(m) for m in experts)


def test_longrope_checked_past_its_switch_and_model_untouched(tmp_path: Path) -> None:
    """The check reaches the long factors (a 17-token prefill), and the model stays usable.

    HF caches ``long_inv_freq`` on the module on the device of the call: the shape run on
    ``meta`` left a meta tensor there, and the next trace crashed on it (``aten::equal`` on meta).
    """
    model = llm_models.build("phi3_longrope")
    rotary = model.model.rotary_emb
    inv_freq = rotary.inv_freq.clone()
    for attempt in range(2):  # the second export reads what the first left on the model
        report = llm.export(model, tmp_path / f"phi3_{attempt}.nnef.tgz", check=True)
        long = [e for e in report.errors if "prefill S=17" in e.name]
        assert long and all(e.ok for e in long), report.errors
    assert report.properties["torchlower.llm.recompute_cache_at"] == 16
    left = [v for v in vars(rotary).values() if isinstance(v, torch.Tensor)]
    assert all(type(v) is torch.Tensor and v.device.type == "cpu" for v in left), left
    assert torch.equal(rotary.inv_freq, inv_freq)


def _logit_scale(model: torch.nn.Module) -> float:
    with torch.no_grad():
        return float(model(PROMPT).logits.abs().max())


def _matrices(path: Path) -> dict[str, bytes]:
    """Payload of every stored matrix (random weights: no two are equal)."""
    import struct
    import tarfile

    out: dict[str, bytes] = {}
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            blob = tar.extractfile(m).read() if m.name.endswith(".dat") else b""  # type: ignore[union-attr]
            dims = struct.unpack_from("<8I", blob, 12) if blob else ()
            if sum(d > 1 for d in dims) >= 2:  # matrices (norm weights are [1, 1, C] ones)
                out[m.name] = blob[128:]
    return out

"""State-space LMs (Mamba): conv and SSM states as explicit graph I/O, one graph for any S.

The export checks a prefill, two decode steps (HF's own cache) and a 3-token continuation from
the prefill's states (against HF's prefill of all 9 tokens); then 32 greedy tokens in tract equal
HF ``generate``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests import llm_models
from tests.cli_inprocess import run_json

pytest.importorskip("transformers")
from torchlower import llm
from torchlower.errors import InvalidArgumentError
from torchlower.llm.runner import Decoder

PROMPT = torch.tensor([[3, 17, 42, 9, 101]])


@pytest.fixture(scope="module")
def mamba() -> torch.nn.Module:
    return llm_models.build_ssm("mamba")


def test_mamba_folder_tokens_equal_hf(mamba: torch.nn.Module, tmp_path: Path) -> None:
    mamba.save_pretrained(tmp_path / "mamba")
    data = run_json("llm", "export", tmp_path / "mamba", "-o", tmp_path / "m.nnef.tgz")
    assert data["states"] == [f"in_{k}_state_{i}" for i in range(2) for k in ("conv", "ssm")]
    assert data["logit_error_vs_original"] < 1e-4
    labels = {e["name"].split(" (")[1] for e in data["outputs_checked"]}
    assert labels == {"prefill)", "decode after 6)", "decode after 7)", "continuation of 3 after 6)"}
    want = llm_models.greedy(mamba, PROMPT, 32)
    assert len(set(want)) > 3  # the chain moves
    decoder = Decoder(tmp_path / "m.nnef.tgz")
    assert decoder.mode == "explicit"  # fixed-size states: nothing for detect_kv_cache
    assert [s[-1] for s in decoder.shapes] == [4, 8, 4, 8]  # conv kernel, state size
    assert llm.generate(tmp_path / "m.nnef.tgz", PROMPT, 32) == want


def test_mamba_f16_and_q4_0(mamba: torch.nn.Module, tmp_path: Path) -> None:
    want = llm_models.greedy(mamba, PROMPT, 16)
    half = llm.export(mamba, tmp_path / "h.nnef.tgz", precision="f16")
    assert all(e.ok for e in half.errors) and half.logit_error < 0.05
    assert Decoder(half.path).dtypes == [np.float16] * 4  # the states cross the boundary in f16
    assert llm.generate(half.path, PROMPT, 16)[:8] == want[:8]
    q = llm.export(mamba, tmp_path / "q.nnef.tgz", compress="q4_0", io_samples=True)
    assert all(e.ok for e in q.errors)  # against HF running the dequantized weights
    assert q.weight_bytes_by_format.get("q4_0", 0) > 0
    # the weights Q4_0 cannot pack say why: A_log and the conv taps folded, a 2-wide dt projection
    mixers = {k.split("mixer.")[1]: why.split(" (")[0] for k, why in q.unquantized.items() if "mixer." in k}
    assert mixers == {
        "A_log": "not stored as itself",
        "conv1d.weight": "not stored as itself",  # sliced into its K taps (ssm_mixers._convolved)
        "dt_proj.weight": "reduced size 2 is not a multiple of 32",
    }
    assert len(llm.generate(q.path, PROMPT, 8)) == 8
    assert "io/continuation.npz" in q.bundled


@pytest.fixture(scope="module")
def mamba2(exports: Any) -> tuple[torch.nn.Module, Any]:
    """The session's export (tests/archive_exports.py), shared with test_archive_kinds."""
    return exports.folder("mamba2")[1], exports.exported("mamba2")


@pytest.mark.xdist_group("mamba2")
def test_mamba2_tokens_equal_hf(mamba2: tuple[torch.nn.Module, Any]) -> None:
    """HF's reference prefill is its chunked scan (chunks of 4: the 6- and 9-token prefills cross
    them), its decode the one-step update; the graph's one recurrence equals both."""
    model, report = mamba2
    assert all(e.ok for e in report.errors) and report.logit_error < 1e-4
    assert report.states == [f"in_{k}_state_{i}" for i in range(2) for k in ("conv", "ssm")]
    want = llm_models.greedy(model, PROMPT, 32)
    assert len(set(want)) > 3
    assert llm.generate(report.path, PROMPT, 32) == want
    assert llm.generate(report.path, PROMPT, 32, prefill_chunk=2) == want


@pytest.mark.xdist_group("mamba2")
def test_mamba2_chunked_prefill_equals_one_call(mamba2: tuple[torch.nn.Module, Any]) -> None:
    """A 9-token prompt fed in calls of 4, 4 and 1 tokens (states carried) gives the logits and
    states of one 9-token call, and of HF's prefill."""
    model, report = mamba2
    prompt = np.array([[3, 17, 42, 9, 101, 5, 77, 23, 140]])
    whole, pieces = Decoder(report.path), Decoder(report.path)
    one, chunked = whole.prefill(prompt), pieces.prefill(prompt, chunk=4)
    with torch.no_grad():
        hf = model(torch.from_numpy(prompt)).logits[0, -1].numpy()
    assert np.abs(chunked - one).max() < 1e-5 and np.abs(one - hf).max() < 1e-4 * np.abs(hf).max()
    assert all(np.abs(a - b).max() < 1e-5 for a, b in zip(whole.past, pieces.past, strict=True))
    assert pieces.length == 9 and len(pieces.past) == 4
    with pytest.raises(InvalidArgumentError, match="prefill_chunk"):
        pieces.prefill(prompt, chunk=0)


@pytest.mark.xdist_group("bamba")
def test_bamba_hybrid_kv_state_and_explicit_ssm_states(exports: Any) -> None:
    """Layer 0 Mamba2 (conv + SSM states), layer 1 attention (KV cache): one archive, and tract's
    detect_kv_cache turns the attention cache into state while the SSM states stay explicit."""
    model, report = exports.folder("bamba")[1], exports.exported("bamba")
    assert all(e.ok for e in report.errors) and report.logit_error < 1e-4
    assert report.states == ["in_conv_state_0", "in_ssm_state_0"]
    assert report.max_context == 128 and report.properties["torchlower.llm.max_context"] == 128
    decoder = Decoder(report.path)
    assert decoder.mode == "state" and len(decoder.fed_facts) == 2  # the KV cache is tract state
    want = llm_models.greedy(model, PROMPT, 32)
    assert len(set(want)) > 3
    assert llm.generate(report.path, PROMPT, 32) == want
    assert llm.generate(report.path, PROMPT, 32, kv="explicit") == want


@pytest.mark.parametrize(
    ("name", "facts"),
    [
        # gated delta net + gated attention + MoE: HF's chunked delta rule at prefill and its
        # recurrent step at decode equal the graph's one ``torchlower::delta_scan``
        pytest.param(
            "qwen3_next", ["1,64,4,f32", "1,4,8,8,f32"], marks=pytest.mark.xdist_group("qwen3_next")
        ),
        # Mamba layers with dt/B/C norms + attention + MoE
        pytest.param("jamba", ["1,64,4,f32", "1,64,8,f32"], marks=pytest.mark.xdist_group("jamba")),
    ],
)
def test_more_hybrids(name: str, facts: list[str], exports: Any) -> None:
    model, report = exports.folder(name)[1], exports.exported(name)
    assert all(e.ok for e in report.errors) and report.logit_error < 1e-4
    assert report.states == ["in_conv_state_0", "in_ssm_state_0"]
    assert Decoder(report.path).fed_facts == facts  # the KV cache is tract state
    want = llm_models.greedy(model, PROMPT, 32)
    assert len(set(want)) > 3
    assert llm.generate(report.path, PROMPT, 32) == want


def test_falcon_h1_attention_and_mamba2_in_parallel(tmp_path: Path) -> None:
    """Every Falcon-H1 layer runs attention and a Mamba2 mixer side by side (each layer carries
    conv and SSM states and a KV cache), with µP multipliers away from 1 on the embedding, the
    key, the attention and SSM inputs and outputs, the mixer's projection sections, the MLP and
    the LM head: the check against HF fails if one is dropped."""
    model = llm_models.build_ssm("falcon_h1")
    report = llm.export(model, tmp_path / "f.nnef.tgz")
    assert all(e.ok for e in report.errors) and report.logit_error < 1e-4
    assert report.states == [f"in_{k}_state_{i}" for i in range(2) for k in ("conv", "ssm")]
    decoder = Decoder(report.path)
    assert decoder.mode == "state"  # both layers' KV caches are tract state
    assert decoder.fed_facts == ["1,96,4,f32", "1,4,16,8,f32"] * 2
    want = llm_models.greedy(model, PROMPT, 32)
    assert len(set(want)) > 3
    assert llm.generate(report.path, PROMPT, 32) == want

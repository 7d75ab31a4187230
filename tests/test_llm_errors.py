"""Bad LLM inputs: typed errors that name the file and the fix, and never a partial archive."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from tests import llm_models

pytest.importorskip("transformers")
from torchlower import llm
from torchlower.errors import InvalidArgumentError, UnsupportedOpsError


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bad") / "hf"
    llm_models.build("llama").save_pretrained(path)
    return path


def _copy(folder: Path, into: Path, skip: tuple[str, ...] = ()) -> Path:
    into.mkdir()
    for f in folder.iterdir():
        if f.name not in skip:
            (into / f.name).write_bytes(f.read_bytes())
    return into


def _nothing_written(out: Path) -> None:
    assert not out.exists() and not [p for p in out.parent.iterdir() if "checking" in p.name]


def test_folder_without_config(folder: Path, tmp_path: Path) -> None:
    bad = _copy(folder, tmp_path / "m", skip=("config.json",))
    with pytest.raises(llm.SourceError, match=r"config\.json: missing.*save_pretrained"):
        llm.export(bad, tmp_path / "o.nnef.tgz")
    _nothing_written(tmp_path / "o.nnef.tgz")


def test_folder_without_weights(folder: Path, tmp_path: Path) -> None:
    bad = _copy(folder, tmp_path / "m", skip=("model.safetensors",))
    with pytest.raises(llm.SourceError, match=r"no weights \(expected model\.safetensors"):
        llm.export(bad, tmp_path / "o.nnef.tgz")


def test_unreadable_checkpoint(folder: Path, tmp_path: Path) -> None:
    bad = _copy(folder, tmp_path / "m")
    (bad / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(llm.SourceError, match=r"model\.safetensors: not a readable safetensors"):
        llm.export(bad, tmp_path / "o.nnef.tgz")
    (bad / "config.json").write_text("{broken")
    with pytest.raises(llm.SourceError, match=r"config\.json: not readable JSON"):
        llm.export(bad, tmp_path / "o.nnef.tgz")


def test_not_a_causal_lm(tmp_path: Path) -> None:
    import transformers

    transformers.ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4).save_pretrained(
        tmp_path / "m"
    )
    (tmp_path / "m" / "model.safetensors").write_bytes(b"")
    with pytest.raises(llm.SourceError, match=r"config\.json: ViTConfig has no causal-LM head"):
        llm.export(tmp_path / "m", tmp_path / "o.nnef.tgz")
    with pytest.raises(InvalidArgumentError, match="PreTrainedModel"):
        llm.export(nn.Linear(2, 2), tmp_path / "o.nnef.tgz")


def test_max_context_beyond_config(folder: Path, tmp_path: Path) -> None:
    with pytest.raises(
        InvalidArgumentError, match=r"max_context=4096 exceeds the model's 128 positions.*<= 128"
    ):
        llm.export(folder, tmp_path / "o.nnef.tgz", max_context=4096)
    with pytest.raises(InvalidArgumentError, match="precision must be one of f32, f16"):
        llm.export(folder, tmp_path / "o.nnef.tgz", precision="bf16")
    _nothing_written(tmp_path / "o.nnef.tgz")


def test_tokenizer_vocab_mismatch(folder: Path, tmp_path: Path) -> None:
    bad = _copy(folder, tmp_path / "m")
    (bad / "tokenizer.json").write_text(llm_models.tokenizer_json(300))  # ids up to 299, vocab 160
    with pytest.raises(llm.SourceError, match=r"tokenizer\.json: the tokenizer produces ids up to 299.*160"):
        llm.export(bad, tmp_path / "o.nnef.tgz")


class _Special(nn.Module):
    """An activation made of two ops without a rule (they must be reported together)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.airy_ai(x) + torch.special.bessel_y1(x)


def test_unsupported_ops_listed_at_once(tmp_path: Path) -> None:
    model = llm_models.build("llama")
    for layer in model.model.layers:
        layer.mlp.act_fn = _Special()
    with pytest.raises(UnsupportedOpsError) as info:
        llm.export(model, tmp_path / "o.nnef.tgz", check=False)
    ops = {o.op for o in info.value.ops}
    assert {"aten::special_airy_ai", "aten::special_bessel_y1"} <= ops
    _nothing_written(tmp_path / "o.nnef.tgz")


def test_tokenizer_bundled_and_user_model_untouched(folder: Path, tmp_path: Path) -> None:
    good = _copy(folder, tmp_path / "m")
    (good / "tokenizer.json").write_text(llm_models.tokenizer_json(160))
    (good / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 128}))
    report = llm.export(good, tmp_path / "o.nnef", check=False)  # a directory artifact
    assert (report.path / "tokenizer.json").read_bytes() == (good / "tokenizer.json").read_bytes()
    assert {"config.json", "tokenizer.json", "tokenizer_config.json"} <= set(report.bundled)
    model = llm_models.build("llama_dynamic_rope").train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rope = model.model.rotary_emb
    llm.export(model, tmp_path / "d.nnef.tgz", check=False)
    assert model.training and rope.rope_type == "dynamic"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_failed_check_writes_nothing_and_names_the_target(folder: Path, tmp_path: Path, monkeypatch) -> None:
    """A reference that tract cannot match (HF's logits shifted by 1): CheckError, no archive."""
    from torchlower.errors import CheckError
    from torchlower.llm import checks

    honest = checks.reference_cases

    def shifted(*args, **kwargs):  # reference_cases, its outputs shifted
        cases = honest(*args, **kwargs)
        for case in cases:
            case.outputs[0] = case.outputs[0] + 1.0
        return cases

    monkeypatch.setattr(checks, "reference_cases", shifted)
    out = tmp_path / "m.nnef.tgz"
    want = rf"^{out}: tract disagrees with Hugging Face .*outputs \(prefill P=0\): max abs 1"
    with pytest.raises(CheckError, match=want):
        llm.export(folder, out)
    _nothing_written(out)


def test_positions_below_the_config_name_the_max_context_that_works(tmp_path: Path) -> None:
    """XGLM's sinusoidal table holds fewer positions than ``max_position_embeddings`` says."""
    import transformers

    from torchlower.errors import DynamicAxisError

    torch.manual_seed(0)
    config = transformers.XGLMConfig(
        **llm_models.NO_SPECIAL, vocab_size=160, d_model=32, num_layers=2, attention_heads=4, ffn_dim=64,
        max_position_embeddings=128,
    )  # fmt: skip
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    out = tmp_path / "x.nnef.tgz"
    with pytest.raises(DynamicAxisError, match=r"export with max_context=126$"):
        llm.export(model, out)
    _nothing_written(out)
    report = llm.export(model, out, max_context=126)
    assert report.errors and all(e.ok for e in report.errors)
    prompt = torch.tensor([[3, 17, 42, 9, 101]])
    assert llm.generate(out, prompt, 16) == llm_models.greedy(model, prompt, 16)

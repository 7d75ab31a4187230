"""LoRA adapters (peft ``save_pretrained`` folders) exported merged and as separate tensors.

A tiny Llama base folder and a peft adapter folder beside it (LoRA on q/k/v/o and the MLP's
gate/up/down, random A and B so the adapter changes the chain); the reference is peft's own
model (``PeftModel.generate``), not torchlower's reading of the adapter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests import llm_models
from torchlower import llm
from torchlower.errors import InvalidArgumentError
from torchlower.llm.lora import AdapterError

peft = pytest.importorskip("peft")

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPT = torch.tensor([[3, 17, 42, 9, 101]])


def adapted(base_name: str, seed: int, **options: Any) -> Any:
    """A peft model over a fresh copy of the base, its LoRA matrices random (B nonzero)."""
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, **options)
    model = peft.get_peft_model(llm_models.build(base_name), config)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.6)
    return model.eval()


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("lora")
    llm_models.build("llama").save_pretrained(root / "base")
    out: dict[str, Any] = {"base": root / "base"}
    for name, seed in (("one", 1), ("two", 2)):
        model = adapted("llama", seed)
        model.save_pretrained(root / name)
        with torch.no_grad():
            out[f"{name}_tokens"] = model.generate(
                input_ids=PROMPT, max_new_tokens=32, do_sample=False, min_new_tokens=32
            )[0, PROMPT.shape[1] :].tolist()
            out[f"{name}_model"] = model
        out[name] = root / name
    return out


@pytest.mark.parametrize("merge", [True, False], ids=["merged", "separate"])
def test_lora_generates_peft_tokens(folders: dict[str, Any], tmp_path: Path, merge: bool) -> None:
    report = llm.export(folders["base"], tmp_path / "m.nnef", lora=folders["one"], merge_lora=merge)
    assert report.properties["torchlower.llm.lora"] == ("merged" if merge else "separate")
    assert llm.generate(report.path, PROMPT, 32) == folders["one_tokens"]
    plain = llm_models.greedy(llm_models.build("llama"), PROMPT, 32)
    assert plain != folders["one_tokens"]  # the adapter matters
    labels = {p.name for p in report.path.iterdir()}
    separate = {n for n in labels if ".lora_" in n}
    assert len(separate) == (0 if merge else 2 * 7 * 2)  # A and B per projection, two layers
    # tract's logits against peft's own forward (not torchlower's reading of the adapter)
    import tract

    ids = np.array([[5, 6, 7, 8, 9, 10]], dtype=np.int64)
    empty = [np.zeros((1, 2, 0, 8), np.float32)] * 4
    runnable = tract.nnef().with_tract_extra().with_tract_transformers().load(str(report.path))
    got = runnable.into_runnable().run([ids, *empty])[0].to_numpy()
    with torch.no_grad():
        want = folders["one_model"](input_ids=torch.from_numpy(ids)).logits[:, -1:].numpy()
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()


def test_separate_adapter_swaps_by_its_files(folders: dict[str, Any], tmp_path: Path) -> None:
    """Another adapter of the same rank and targets: replace lora_A / scaled lora_B .dat files."""
    from safetensors.torch import load_file

    from torchlower.nnef import dat

    report = llm.export(folders["base"], tmp_path / "s.nnef", lora=folders["one"], check=False)
    config = json.loads((folders["two"] / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    for key, tensor in load_file(str(folders["two"] / "adapter_model.safetensors")).items():
        label = "model." + key.removeprefix("base_model.model.").removesuffix(".weight")
        values = tensor * scale if label.endswith("lora_B") else tensor
        (report.path / f"{label}.dat").write_bytes(dat.encode(values[None].numpy()))
    assert llm.generate(report.path, PROMPT, 32) == folders["two_tokens"]


def test_cli_lora_and_q4_0_keeps_adapters_float(
    folders: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """In-process CLI (the options reach the export); q4_0 checked against the dequantized model."""
    from torchlower.cli import main

    args = ["llm", "export", str(folders["base"]), "-o", str(tmp_path / "q.nnef.tgz"), "--compress", "q4_0"]
    assert main([*args, "--lora", str(folders["one"]), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["checked"]
    lora = {k: v for k, v in data["unquantized"].items() if ".lora_" in k}
    assert len(lora) == 28 and all("LoRA adapter" in why for why in lora.values())
    assert "adapter_config.json" in data["bundled"] and data["lora"] == "separate"


@pytest.mark.parametrize(
    ("options", "option"),
    [({"use_dora": True}, "use_dora"), ({"lora_bias": True}, "lora_bias"), ({"bias": "all"}, "bias")],
)
def test_unsupported_peft_options_are_refused(
    tmp_path: Path, folders: dict[str, Any], options: dict[str, Any], option: str
) -> None:
    adapted("llama", 3, **options).save_pretrained(tmp_path / "ad")
    with pytest.raises(AdapterError, match=option) as info:
        llm.export(folders["base"], tmp_path / "x.nnef", lora=tmp_path / "ad", check=False)
    assert info.value.option == option and not (tmp_path / "x.nnef").exists()


def test_other_peft_type_is_refused(tmp_path: Path, folders: dict[str, Any]) -> None:
    targets = ["k_proj", "v_proj", "down_proj"]
    config = peft.IA3Config(target_modules=targets, feedforward_modules=["down_proj"])
    peft.get_peft_model(llm_models.build("llama"), config).save_pretrained(tmp_path / "ia3")
    with pytest.raises(AdapterError, match="peft_type 'IA3'"):
        llm.export(folders["base"], tmp_path / "x.nnef", lora=tmp_path / "ia3", check=False)


def test_adapter_for_another_base_is_refused(tmp_path: Path, folders: dict[str, Any]) -> None:
    adapted("gemma", 4).save_pretrained(tmp_path / "gemma_ad")  # head_dim 16: other q/k/v shapes
    with pytest.raises(AdapterError, match="trained on another base") as info:
        llm.export(folders["base"], tmp_path / "x.nnef", lora=tmp_path / "gemma_ad", check=False)
    assert info.value.option == "base" and "self_attn" in str(info.value)
    with pytest.raises(InvalidArgumentError, match="merge_lora=True needs lora="):
        llm.export(folders["base"], tmp_path / "x.nnef", merge_lora=True)
    with pytest.raises(InvalidArgumentError, match="pass its base model"):
        llm.export(folders["one_model"], tmp_path / "x.nnef")


@pytest.mark.parametrize(
    "options",
    [{"rank_pattern": {"down_proj": 8}, "alpha_pattern": {"q_proj": 4}}, {"use_rslora": True}],
    ids=["patterns", "rslora"],
)
def test_scales_are_peft_scales(tmp_path: Path, options: dict[str, Any]) -> None:
    """Each module's rank and scale as peft resolves them (no export: the adapter reading alone)."""
    from torchlower.llm.lora import read_adapter

    model = adapted("llama", 6, **options)
    model.save_pretrained(tmp_path / "ad")
    pairs = {p.module: p for p in read_adapter(tmp_path / "ad").pairs}
    layers = {
        n.removeprefix("base_model.model."): m for n, m in model.named_modules() if hasattr(m, "lora_A")
    }
    assert set(pairs) == set(layers) and len(pairs) == 14
    for name, layer in layers.items():
        assert pairs[name].scale == pytest.approx(layer.scaling["default"], rel=1e-12)
        assert pairs[name].rank == layer.r["default"]


def test_a_loaded_base_is_left_as_it_was(folders: dict[str, Any], tmp_path: Path) -> None:
    base = llm_models.build("llama")
    before = {n: p.detach().clone() for n, p in base.named_parameters()}
    llm.export(base, tmp_path / "m.nnef", lora=folders["one"], merge_lora=True, check=False)
    assert type(base.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert all(torch.equal(p, before[n]) for n, p in base.named_parameters())

"""Every command on every kind of artifact torchlower writes (issue 31, "First, a bug").

One test per kind runs ``torchlower inspect``, ``check``, ``run`` (and for LLMs ``llm
generate``) through the CLI's entry point in process, and ``torchlower.load`` / ``inspect`` from
Python: inspect shows the bundled metadata, check compares with the bundled samples (or the
expected outputs) and reports the error, run gives the library's outputs, and a damaged copy
fails with a typed error naming the user's path. The LLM exports are the session's
(``tests/archive_exports.py``, shared with the per-model modules); the others are made here.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from rich.console import Console
from torch import nn

import torchlower
from tests import archive_exports, speech_models, vlm_models
from tests.cli_inprocess import Ran, run, run_json
from torchlower.cli import llm_generate_cmd

pytest.importorskip("transformers")
from torchlower import llm
from torchlower.errors import ArtifactError
from torchlower.nnef import reader

PROMPT = [3, 17, 42, 9]


@dataclass(frozen=True)
class Made:
    """An artifact to read back: its path, what inspect must show, and the reference to check with."""

    path: Path
    model_type: str | None = None  # torchlower.llm.model_type (and the bundled config's)
    inputs: dict[str, np.ndarray] | None = None  # given to check / run when nothing is bundled
    expected: dict[str, np.ndarray] | None = None  # what check compares with then
    media: dict[str, np.ndarray] | None = None  # llm generate's --media
    start: list[int] | None = None  # llm generate's --ids (default PROMPT)


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def _plain(root: Path, dynamic: bool) -> Made:
    torch.manual_seed(0)
    net = _Net().eval()
    x = torch.randn(3, 8)
    path = root / ("dynamic.nnef.tar" if dynamic else "dense.nnef.tgz")
    torchlower.export(net, x, path, dynamic_axes={"x": {0: "B"}} if dynamic else None)
    given = torch.randn(5 if dynamic else 3, 8)
    with torch.no_grad():
        return Made(path, inputs={"x": given.numpy()}, expected={"output": net(given).numpy()})


def _stream(root: Path) -> Made:
    from tests.streaming_models import CausalTCN, model_of

    model = model_of(CausalTCN)
    path = root / "tcn.nnef.tgz"
    torchlower.export(model, torch.randn(1, 4, 64), path, dynamic_axes={"x": {2: "T"}}, stream={"T": 16})
    given = torch.randn(1, 4, 80, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return Made(path, inputs={"x": given.numpy()}, expected={"output": model(given).numpy()})


def _lattice(root: Path) -> Made:
    from torchlower import lattice as L

    class Sparse(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c = L.SubmConv3d(3, 4, 3, bias=True)
            self.g = L.GlobalAvgPool(2)
            self.fc = nn.Linear(4, 2)

        def forward(self, x: Any) -> torch.Tensor:
            return self.fc(self.g(self.c(x)))

    torch.manual_seed(0)
    coords = torch.cat([torch.randint(0, 2, (40, 1)), torch.randint(-3, 3, (40, 3))], dim=1)
    coords = torch.unique(coords, dim=0).int()
    x = L.SparseTensor(torch.randn(len(coords), 3), coords)
    model = Sparse().eval()
    L.save(model, root / "sparse", (x,), output_names=["logits"])
    given = {"x_coords": coords.numpy(), "x_features": x.feats.numpy(),
             "x_active": np.array([len(coords)], dtype=np.int32)}  # fmt: skip
    with torch.no_grad():
        return Made(root / "sparse", inputs=given, expected={"logits": model(x).numpy()})


def _llama(root: Path, exports: Any, **options: Any) -> Made:
    path = root / ("llama.nnef" if "compress" in options else "llama.nnef.tgz")  # q4_0: a folder
    llm.export(exports.folder("llama")[0], path, io_samples=True, check=False, **options)
    return Made(path, "llama")


def _lora(root: Path, exports: Any) -> Made:
    import peft

    from tests import llm_models

    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
    model = peft.get_peft_model(llm_models.build("llama"), config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.6, generator=torch.Generator().manual_seed(3))
    model.save_pretrained(root / "adapter")
    path = root / "lora.nnef.tgz"
    llm.export(exports.folder("llama")[0], path, lora=root / "adapter", io_samples=True, check=False)
    return Made(path, "llama")


def _shared(kind: str) -> Callable[[Path, Any], Made]:
    """The session's checked export of ``kind`` and the media ``llm generate`` takes."""

    def make(root: Path, exports: Any) -> Made:
        model = exports.folder(kind)[1]
        path = exports.exported(kind).path
        if kind in archive_exports.STATE_SPACE:
            return Made(path, kind)
        if kind in archive_exports.SPEECH:
            start = [int(model.config.decoder_start_token_id)]
            samples = speech_models.audio(5) if kind == "moonshine" else speech_models.features(model, 5)
            return Made(path, _MODEL_TYPES.get(kind, kind), media={"input_features": samples.numpy()},
                        start=start)  # fmt: skip
        ids, media = _multimodal_prompt(kind, model)
        return Made(path, kind, media={k: v.numpy() for k, v in media.items()}, start=ids)

    return make


_MODEL_TYPES = {"speech2text": "speech_to_text"}


def _multimodal_prompt(kind: str, model: Any) -> tuple[list[int], dict[str, torch.Tensor]]:
    if kind == "qwen2_audio":
        features, mask = vlm_models.audio_features(model, 3, real=29)
        ids = vlm_models.audio_prompt(model, mask, 3)
        return ids[0].tolist(), {"input_features": features, "feature_attention_mask": mask}
    pixels = vlm_models.qwen2_vl_pixels(model, 3) if kind == "qwen2_vl" else vlm_models.pixels(model, 3)
    return vlm_models.prompt(model, images=1, seed=3)[0].tolist(), {"pixel_values": pixels}


def _qwen2_vl_by_cli(option: str) -> Callable[[Path, Any], Made]:
    """Qwen2-VL exported by ``torchlower llm export`` in f16 or q4_0 (checked end to end)."""

    def make(root: Path, exports: Any) -> Made:
        folder, model = exports.folder("qwen2_vl")
        out = root / f"qwen2_vl_{option.split()[-1]}"
        data = run_json("llm", "export", folder, "-o", out, *option.split(), "--io-samples")
        assert data["kind"] == "multimodal_lm" and len(data["tokens"]) == 8
        ids, media = _multimodal_prompt("qwen2_vl", model)
        return Made(out, "qwen2_vl", media={k: v.numpy() for k, v in media.items()}, start=ids)

    return make


KINDS: dict[str, Callable[[Path, Any], Made]] = {
    "dense": lambda root, _e: _plain(root, dynamic=False),
    "dynamic": lambda root, _e: _plain(root, dynamic=True),
    "streaming": lambda root, _e: _stream(root),
    "lattice": lambda root, _e: _lattice(root),
    "llama_f32": lambda root, e: _llama(root, e),
    "llama_f16": lambda root, e: _llama(root, e, precision="f16"),
    "llama_q4_0": lambda root, e: _llama(root, e, compress="q4_0"),
    "lora_separate": _lora,
    **{k: _shared(k) for k in ("mamba2", "bamba", "jamba", "qwen3_next")},
    **{k: _shared(k) for k in (*archive_exports.SPEECH, *archive_exports.MULTIMODAL)},
    "qwen2_vl_f16": _qwen2_vl_by_cli("--precision f16"),
    "qwen2_vl_q4_0": _qwen2_vl_by_cli("--compress q4_0"),
}


def _group(kind: str) -> str:
    """The xdist group: a kind made from a shared export runs beside its per-model module."""
    if kind.startswith(("llama_", "lora_")):
        return "llama"
    return kind.removesuffix("_f16").removesuffix("_q4_0")


@pytest.mark.parametrize(
    "kind", [pytest.param(k, marks=pytest.mark.xdist_group(_group(k))) for k in KINDS]
)  # fmt: skip
def test_every_command(kind: str, exports: Any, tmp_path: Path) -> None:
    made = KINDS[kind](tmp_path, exports)
    if made.path.is_dir() and (made.path / "graph.mlir").exists():
        _lattice_commands(made, tmp_path)
    elif made.path.is_dir() and (made.path / "manifest.json").exists():
        _folder_commands(made, tmp_path)
    else:
        _archive_commands(made, tmp_path)


# ---- one NNEF archive -------------------------------------------------------------------------
def _archive_commands(made: Made, tmp: Path) -> None:
    path = made.path
    summary = run_json("inspect", path)
    assert summary["inputs"] and all(o["shape"] is not None for o in summary["outputs"])  # tract's facts
    bundle = summary["bundled"]
    assert torchlower.inspect(path, tract=False)["ops"] == summary["ops"]
    art = torchlower.load(path)
    assert art.path == path and art.weights and sorted(art.bundled) == [f["name"] for f in bundle["files"]]
    text = run("inspect", path, "--no-shapes").stdout
    if made.model_type:  # what was exported, from the graph's properties and the bundled config
        assert bundle["properties"]["torchlower.llm.model_type"] == made.model_type
        assert bundle["config"]["model_type"] == made.model_type
        assert _row(text, "property torchlower.llm.model_type", made.model_type)
        assert "bundled config.json" in text
    if summary["streaming"]:  # verified at export; run --stream gives the model's outputs
        assert summary["streaming"]["pulse"] == 16 and "streaming" in text
        _stream_equals_model(made, tmp)
    samples = bundle.get("samples", {})
    checked = _check(path, made, tmp)
    if made.inputs is None:  # the bundled samples: every graph input and output recorded
        complete = [
            n for n, arrays in samples.items() if set(arrays) >= {i["name"] for i in summary["inputs"]}
        ]
        assert checked["reference"] == "bundled samples" and {p["label"] for p in checked["points"]} == set(
            complete
        )
        given = _sample(art, complete[0])
    else:
        given = made.inputs
    _run_equals_library(path, given, tmp)
    if made.model_type:
        _generate(made, tmp)
    _damaged_archive(path, tmp)


def _stream_equals_model(made: Made, tmp: Path) -> None:
    np.savez(tmp / "stream_in.npz", **(made.inputs or {}))
    ran = run_json(
        "run", made.path, "--stream", "T=8", "--inputs", tmp / "stream_in.npz", "--out", tmp / "s.npz"
    )
    assert ran["delay"] == 0
    with np.load(tmp / "s.npz") as got:
        assert np.abs(got["output"] - (made.expected or {})["output"]).max() < 1e-5


def _row(text: str, item: str, value: str) -> bool:
    """A row ``item | value`` of a rendered table."""
    return re.search(rf"{re.escape(item)}\W+{re.escape(value)}\b", text) is not None


def _check(path: Path, made: Made, tmp: Path) -> dict[str, Any]:
    """``check``: against the bundled samples, else the expected outputs; reports the error."""
    if made.inputs is None:
        checked = run_json("check", path)
    else:
        np.savez(tmp / "in.npz", **made.inputs)
        np.savez(tmp / "want.npz", **(made.expected or {}))
        checked = run_json("check", path, "--inputs", tmp / "in.npz", "--expected", tmp / "want.npz")
        assert checked["reference"] == "expected"
    assert checked["compared"] and all(e["ok"] for e in checked["compared"])
    assert isinstance(checked["max_abs_error"], float) and checked["max_abs_error"] < 0.5
    return checked


def _sample(art: Any, name: str) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(art.bundled[name])) as data:
        return {n: data[n] for n in art.input_names}


def _run_equals_library(path: Path, given: dict[str, np.ndarray], tmp: Path) -> None:
    """``run --inputs --out``: the outputs ``torchlower.load(path).run`` gives, bit for bit."""
    np.savez(tmp / "run_in.npz", **given)
    ran = run_json("run", path, "--inputs", tmp / "run_in.npz", "--out", tmp / "run_out.npz")
    assert ran["engine"] == "tract" and not ran["random_inputs"]
    with np.load(tmp / "run_out.npz") as got:
        want = torchlower.load(path).run(given, isolated=False)
        assert list(got.files) == list(want) and all(np.array_equal(got[k], want[k]) for k in want)


def _damaged_archive(path: Path, tmp: Path) -> None:
    """A copy without one weight: every command names the copy, never a private folder."""
    members = dict(reader.read_members(path))
    dropped = sorted(n for n in members if n.endswith(".dat"))[-1]
    broken = tmp / "broken.nnef.tgz"
    _write_tar(broken, {n: b for n, b in members.items() if n != dropped})
    for command in ("inspect", "check", "run"):
        _refused(run(command, broken), broken, command)
    with pytest.raises(ArtifactError, match=str(broken)):
        torchlower.load(broken)


def _refused(ran: Ran, path: Path, command: str, code: int = 2) -> None:
    assert ran.returncode == code, (command, ran.stderr)
    assert str(path) in ran.stderr and "torchlower-artifact-" not in ran.stderr, (command, ran.stderr)


def _write_tar(target: Path, files: dict[str, bytes]) -> None:
    with tarfile.open(target, "w:gz" if target.name.endswith("tgz") else "w") as tar:
        for name, blob in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))


# ---- llm generate -------------------------------------------------------------------------------
def _generate_args(made: Made, path: Path, tmp: Path) -> list[Any]:
    """``torchlower llm generate PATH --ids … -n 8 [--media …]`` for ``made``'s model."""
    args: list[Any] = ["llm", "generate", path, "--ids", ",".join(map(str, made.start or PROMPT)), "-n", "8"]
    if made.media:
        np.savez(tmp / "media.npz", **made.media)
        args += ["--media", tmp / "media.npz"]
    return args


def _generate(made: Made, tmp: Path) -> None:
    """``torchlower llm generate``: the tokens of ``torchlower.llm.generate``."""
    args = _generate_args(made, made.path, tmp)
    data = run_json(*args)
    want = llm.generate(made.path, made.start or PROMPT, 8, **(made.media or {}))
    assert data["tokens"] == want and len(want) >= 1
    console = Console(record=True, width=110)
    llm_generate_cmd.render(console, data)
    assert _row(console.export_text(), "tokens", " ".join(map(str, want)))


# ---- a folder of archives (speech encoder-decoders, multimodal LMs) ----------------------------
def _folder_commands(made: Made, tmp: Path) -> None:
    path = made.path
    manifest = json.loads((path / "manifest.json").read_text())
    parts = {k: path / v["archive"] for k, v in manifest.items() if isinstance(v, dict) and "archive" in v}
    summary = run_json("inspect", path, "--no-shapes")
    assert summary["format"] == "parts" and set(summary["parts"]) == set(parts)
    assert summary["manifest"]["model_type"] == made.model_type
    for name, part in summary["parts"].items():
        props = part["bundled"]["properties"]
        assert props["torchlower.llm.model_type"] == made.model_type and props["torchlower.llm.part"] in (
            name, "vision", "audio")  # fmt: skip
        assert "io/example.npz" in part["bundled"]["samples"]
    assert summary["parts"]["decoder"]["bundled"]["config"]["model_type"] == made.model_type
    text = run("inspect", path, "--no-shapes").stdout
    assert _row(text, "manifest model_type", made.model_type) and "part decoder" in text
    assert torchlower.inspect(path, tract=False)["manifest"] == manifest
    with pytest.raises(ArtifactError, match="a folder of"):
        torchlower.load(path)
    checked = run_json("check", path)  # every part against its bundled sample
    assert set(checked["parts"]) == set(parts)
    for part in checked["parts"].values():
        assert part["reference"] == "bundled samples" and all(e["ok"] for e in part["compared"])
        assert isinstance(part["max_abs_error"], float)
    refused = run("run", path)
    assert refused.returncode == 2 and "torchlower llm generate" in refused.stderr
    for name, archive in parts.items():  # each loads; the decoder runs (the others ran in check)
        assert torchlower.load(archive).properties["torchlower.llm.part"] in (name, "vision", "audio")
    _run_equals_library(parts["decoder"], _sample(torchlower.load(parts["decoder"]), "io/example.npz"), tmp)
    _generate(made, tmp)
    _damaged_folder(made, tmp)


def _damaged_folder(made: Made, tmp: Path) -> None:
    """A copy without its decoder, then with a broken manifest: typed errors naming the copy."""
    copy = tmp / "copy_tract"
    shutil.copytree(made.path, copy)
    missing = copy / "decoder.nnef.tgz"
    missing.unlink()
    for command in ("inspect", "check"):
        _refused(run(command, copy), missing, command)
    _refused(run(*_generate_args(made, copy, tmp)), missing, "generate")
    with pytest.raises(ArtifactError, match=str(missing)):
        llm.generate(copy, made.start or PROMPT, 2, **(made.media or {}))
    (copy / "manifest.json").write_text("{not json")
    for command in ("inspect", "check", "run"):
        _refused(run(command, copy), copy / "manifest.json", command)


# ---- a lattice folder ---------------------------------------------------------------------------
def _lattice_commands(made: Made, tmp: Path) -> None:
    path = made.path
    summary = run_json("inspect", path)
    assert summary["ir_version"] == 2 and summary["inputs"] and summary["outputs"]
    assert torchlower.inspect(path)["ops"] == summary["ops"]
    checked = _check(path, made, tmp)
    assert checked["outputs"]
    np.savez(tmp / "run_in.npz", **(made.inputs or {}))
    ran = run_json("run", path, "--inputs", tmp / "run_in.npz", "--out", tmp / "run_out.npz")
    assert ran["engine"] == "the reference executor"
    with np.load(tmp / "run_out.npz") as got:
        want = torchlower.load(path).run(made.inputs)
        assert all(np.array_equal(got[k], want[k]) for k in want)
    copy = tmp / "copy_sparse"
    shutil.copytree(path, copy)
    (copy / "weights.safetensors").unlink()
    for command in ("inspect", "check", "run"):
        args = ("--inputs", tmp / "run_in.npz") if command != "inspect" else ()
        _refused(run(command, copy, *args), copy, command)

"""Every command reads every archive torchlower writes (issue 31, "First, a bug").

The kinds: a dense model (static shapes), a dynamic one (a symbolic batch), LLM archives in f32
(with ``io/*.npz`` samples, a tokenizer and generation_config.json), f16 and q4_0, and a lattice
folder. ``torchlower inspect``, ``check`` and ``run`` run on each as a user would (a subprocess),
and ``torchlower.load`` / ``inspect`` / ``check`` from Python; errors name the user's path.
"""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import torchlower
from tests import llm_models
from tests.test_cli import cli

pytest.importorskip("transformers")
from torchlower import llm
from torchlower.artifact.inputs import inputs_for
from torchlower.errors import ArtifactError, CheckError, InvalidArgumentError
from torchlower.nnef import reader

KINDS = ("dense", "dynamic", "llm_f32", "llm_f16", "llm_q4_0", "lattice")
LLM_KINDS = ("llm_f32", "llm_f16", "llm_q4_0")


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def _lattice(root: Path) -> tuple[Path, Path]:
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
    L.save(Sparse().eval(), root / "sparse", (x,), output_names=["logits"])
    inputs = root / "sparse_in.npz"
    np.savez(inputs, x_coords=coords.numpy(), x_features=x.feats.numpy(),
             x_active=np.array([len(coords)], dtype=np.int32))  # fmt: skip
    return root / "sparse", inputs


@pytest.fixture(scope="module")
def archives(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kinds")
    torch.manual_seed(0)
    net = _Net().eval()
    out = {
        "dense": torchlower.export(net, torch.randn(2, 8), root / "dense.nnef.tgz").path,
        "dynamic": torchlower.export(
            net, torch.randn(3, 8), root / "dynamic.nnef.tar", dynamic_axes={"x": {0: "B"}}
        ).path,
    }
    model = llm_models.build("llama")
    folder = root / "hf"
    model.save_pretrained(folder)
    (folder / "tokenizer.json").write_text(llm_models.tokenizer_json(160))
    out["llm_f32"] = llm.export(folder, root / "llm_f32.nnef.tgz", io_samples=True).path
    out["llm_f16"] = llm.export(folder, root / "llm_f16.nnef.tgz", precision="f16", io_samples=True).path
    out["llm_q4_0"] = llm.export(folder, root / "llm_q4.nnef", compress="q4_0").path  # a folder
    out["lattice"], out["lattice_inputs"] = _lattice(root)
    return out


def _json(*args: Any, code: int = 0) -> dict[str, Any]:
    proc = cli(*map(str, args), "--json")
    assert proc.returncode == code, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.parametrize("kind", KINDS)
def test_inspect_check_run_on_every_kind(archives: dict[str, Path], kind: str) -> None:
    path = archives[kind]
    summary = _json("inspect", path)
    assert summary["ok"] and summary["inputs"] and summary["outputs"]
    given = ["--inputs", archives["lattice_inputs"]] if kind == "lattice" else []
    ran = _json("run", path, *given)
    assert ran["engine"] == ("the reference executor" if kind == "lattice" else "tract")
    assert all(o.get("finite", 1) > 0 for o in ran["outputs"])
    checked = _json("check", path, *given)
    assert checked["ok"] and checked["outputs"]
    if kind in LLM_KINDS:
        bundle = summary["bundled"]
        names = [f["name"] for f in bundle["files"]]
        assert {"config.json", "generation_config.json", "tokenizer.json"} <= set(names)
        assert bundle["config"]["model_type"] == "llama"
        assert bundle["config"]["architectures"] == ["LlamaForCausalLM"]
        assert bundle["properties"]["torchlower.llm.max_context"] == 128
        want = kind.removeprefix("llm_").replace("q4_0", "f32")
        assert bundle["properties"]["torchlower.llm.precision"] == want
        text = cli("inspect", path, "--no-shapes").stdout
        assert "bundled config.json" in text and "property torchlower.llm.max_context" in text
        picture = path.with_name(f"{kind}.svg")
        drawn = _json("inspect", path, "--svg", picture, "--no-shapes")["picture"]
        assert drawn["nodes"] > 5 and picture.read_text().startswith("<")
    if kind in ("llm_f32", "llm_f16"):  # bundled samples: the check compares with them
        assert checked["reference"] == "bundled samples"
        labels = {p["label"] for p in checked["points"]}
        assert labels == {"io/prompt.npz", "io/prompt_with_past.npz", "io/decode_step.npz"}
        assert all(e["ok"] for p in checked["points"] for e in p["outputs"])
        assert "io/prompt.npz" in summary["bundled"]["samples"]
    elif kind != "lattice":
        assert checked["reference"] is None


@pytest.mark.parametrize("kind", ("dense", "dynamic", *LLM_KINDS))
def test_python_api_on_every_kind(archives: dict[str, Path], kind: str) -> None:
    path = archives[kind]
    art = torchlower.load(path)
    assert art.path == path and art.weights
    info = torchlower.inspect(path, tract=False)
    if kind in ("dense", "dynamic"):
        assert info["bundled"] == {"files": [], "properties": {}}
    if kind in LLM_KINDS:
        assert "config.json" in art.bundled and art.properties["torchlower.llm.model_type"] == "llama"
        assert json.loads(art.bundled["config.json"])["model_type"] == "llama"
    result = torchlower.check(path)
    assert result.outputs
    if kind in ("llm_f32", "llm_f16"):
        assert result.errors and result.ok and result.max_abs_error < 0.05
    with art:
        outs = art.run(inputs_for(art, None, None, 1))
    assert all(np.isfinite(o).all() for o in outs.values())


def test_llm_sample_check_catches_wrong_numbers(archives: dict[str, Path], tmp_path: Path) -> None:
    """A sample whose recorded logits are off fails the check, naming the sample and output."""
    bad = tmp_path / "bad.nnef.tar"
    _rewrite(archives["llm_f32"], bad, "io/decode_step.npz", _shift_logits)
    with pytest.raises(CheckError, match=r"outputs \(io/decode_step\.npz\).*max abs") as err:
        torchlower.check(bad)
    assert str(bad) in str(err.value)
    proc = cli("check", bad)
    assert proc.returncode != 0 and "io/decode_step.npz" in proc.stderr


def test_errors_name_the_users_path(archives: dict[str, Path], tmp_path: Path) -> None:
    """A damaged bundled file or an unknown member: every command names the archive given, never
    the private folder the reader extracts to."""
    broken = tmp_path / "broken.nnef.tgz"
    _rewrite(archives["llm_f32"], broken, "config.json", lambda _b: b"{not json")
    stray = tmp_path / "stray.nnef.tgz"
    _rewrite(archives["dense"], stray, "notes.txt", lambda _b: b"hello")
    for path, why in (
        (broken, "bundled 'config.json' is not JSON"),
        (stray, "unexpected member 'notes.txt'"),
    ):
        for command in ("inspect", "check", "run"):
            proc = cli(command, path)
            assert proc.returncode != 0, command
            assert str(path) in proc.stderr and why in proc.stderr, (command, proc.stderr)
            assert "torchlower-artifact-" not in proc.stderr
        with pytest.raises(ArtifactError, match=str(path)):
            torchlower.check(path)
    unpacked = tmp_path / "unpacked.nnef"  # a folder with a file the reader reads by member name
    shutil.copytree(archives["llm_q4_0"], unpacked)
    (unpacked / "io").mkdir()
    (unpacked / "io" / "x.npz").write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip: no arrays
    assert torchlower.inspect(unpacked, tract=False)["bundled"]["samples"] == {"io/x.npz": {}}
    (unpacked / "io" / "x.npz").write_bytes(b"garbage")
    with pytest.raises(ArtifactError, match=rf"{unpacked}: bundled 'io/x.npz' is not a readable \.npz"):
        torchlower.load(unpacked)


def test_one_position_past_the_context_is_refused(archives: dict[str, Path]) -> None:
    """P + S = max_context runs; one more is a typed refusal from run and check (tract itself
    would read past the position table and abort)."""
    path = archives["llm_f32"]
    art = torchlower.load(path)
    ids = np.zeros((1, 1), dtype=np.int64)

    def caches(p: int) -> list[np.ndarray]:
        return [np.zeros((1, 2, p, 8), np.float32) for _ in range(4)]

    with art:
        assert np.isfinite(art.run([ids, *caches(127)])["outputs"]).all()
        with pytest.raises(InvalidArgumentError, match=r"P \+ S = 129 .*bound P \+ S <= 128"):
            art.run([ids, *caches(128)])
    with pytest.raises(InvalidArgumentError, match=str(path)):
        torchlower.check(path, [ids, *caches(128)])


def _shift_logits(blob: bytes) -> bytes:
    with np.load(io.BytesIO(blob)) as data:
        arrays = {k: data[k] for k in data}
    arrays["outputs"] = arrays["outputs"] + 1.0
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def _rewrite(source: Path, target: Path, member: str, change: Any) -> None:
    """``source`` (tar / tgz / folder) as a tar or tgz at ``target`` with ``member`` changed (or added)."""
    files = dict(reader.read_members(source))
    files[member] = change(files.get(member, b""))
    mode = "w:gz" if target.name.endswith("tgz") else "w"
    with tarfile.open(target, mode) as tar:
        for name, blob in sorted(files.items()):
            info = tarfile.TarInfo(name)
            info.size = len(blob)
            tar.addfile(info, io.BytesIO(blob))

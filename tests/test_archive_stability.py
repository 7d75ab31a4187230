"""A fixed set of exports keeps its exact bytes: refactoring the pipeline (issue 27) or any later
change that means to keep behaviour must not change a single byte of what we write.

The digests below were recorded before the pipeline was split into stages. Every weight is a
small dyadic rational (an integer over 16) and no export folds a transcendental function
(rotary tables, exp, cos) into a constant, so the arithmetic that produces the bytes is exact
IEEE float32 on every CPU: the digests do not depend on BLAS or the instruction set. The
``.nnef.tgz`` digest is taken over the *uncompressed* tar stream, so a different zlib build
cannot change it either. A deliberate format change re-records them
(``python -m tests.test_archive_stability``) and says so in its commit.
"""

from __future__ import annotations

import gzip
import hashlib
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import torchlower
from torchlower import lattice as L

DIGESTS = {
    "cnn_jit": "fbfba227982384a5cde3c219d563e2f0b427c13c313ab9a7b29b778efb21d997",
    "cnn_fx": "00df2bc89456eb692d8e976a8c40e7b811af7c8f60edfe84b8d5fe152d876e43",
    "cnn_export": "8e21927da632b2e8920140f017328c6b70006d38775bdd4f8c4308114cc3dc48",
    "cnn_f16": "8f85ecffaf010d6a58bb92e32ed5156f608fb37f0bc3c9a83b1af7fd70692118",
    "mlp_dynamic": "02e37fc82da407733205ceee8859f7522884c790fe23bbddd795f48032f54b72",
    "mlp_q4_0": "c698cccdaaac297ebaa90c917dfe50452ea908ba23ff047a6848ef75fcdc3308",
    "encoder_layer": "3becbdba1a948388c7a5aa1ff29bd2511d6f4fc4297724f2f8a08f51c0298652",
    "gpt2_llm": "e24d35b9b98e077c678104d7cdc6cc1caff85dd3c4ba7f9e10bd4b7311c9adb7",
    "lattice_head": "50efb4272e4b0de46dfc9c5fd79fddf2cc7a23ce514734b1e8c9bd7af805037a",
}


def dyadic(model: nn.Module, seed: int) -> nn.Module:
    """Every parameter and float buffer set to k/16, k in [-8, 8): exact in f32 and f16."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.is_floating_point():
                t.copy_(torch.randint(-8, 8, t.shape, generator=g).to(t.dtype) / 16)
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_var.copy_(m.running_var.abs() + 0.5)  # a positive variance
    return model.eval()


def ints(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randint(-8, 8, shape, generator=torch.Generator().manual_seed(seed)).float() / 8


def cnn() -> nn.Module:
    from torchlower.cli.demo import image_classifier

    return dyadic(image_classifier(), 1)


def mlp() -> nn.Module:
    return dyadic(nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 32), nn.LayerNorm(32)), 2)


def tar_digest(path: Path, skip: tuple[str, ...] = ()) -> str:
    """The uncompressed tar stream's digest, or with ``skip`` its members' names and bytes
    without those (the Hugging Face files an LLM archive bundles carry transformers' version)."""
    if not skip:
        return hashlib.sha256(gzip.decompress(path.read_bytes())).hexdigest()
    h = hashlib.sha256()
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            if member.name not in skip:
                h.update(member.name.encode() + b"\0" + tar.extractfile(member).read())  # type: ignore[union-attr]
    return h.hexdigest()


def folder_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        h.update(f.relative_to(folder).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def export(model: nn.Module, x: torch.Tensor, **options: Any) -> Callable[[Path], str]:
    def run(tmp: Path) -> str:
        return tar_digest(torchlower.export(model, x, tmp / "m.nnef.tgz", **options).path)

    return run


def gpt2_llm(tmp: Path) -> str:
    import transformers

    from torchlower import llm

    config = transformers.GPT2Config(
        vocab_size=96, n_embd=32, n_layer=1, n_head=4, n_positions=64, bos_token_id=None, eos_token_id=None
    )
    dyadic(transformers.GPT2LMHeadModel(config), 5).save_pretrained(tmp / "hf")
    bundled = ("config.json", "generation_config.json")
    return tar_digest(llm.export(tmp / "hf", tmp / "gpt2.nnef.tgz", check=False).path, skip=bundled)


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c, self.r, self.g, self.fc = L.SubmConv3d(3, 8, 3), nn.ReLU(), L.GlobalAvgPool(), nn.Linear(8, 5)

    def forward(self, x: L.SparseTensor) -> torch.Tensor:
        return self.fc(self.g(self.r(self.c(x))))


def lattice_head(tmp: Path) -> str:
    g = torch.Generator().manual_seed(6)
    coords = torch.unique(torch.randint(-4, 4, (80, 4), generator=g) * torch.tensor([0, 1, 1, 1]), dim=0)
    x = L.SparseTensor(ints((len(coords), 3), 7), coords.int(), 1)
    return folder_digest(L.save(dyadic(Head(), 8), tmp / "head", (x,), batch_size=1).path)


CASES: dict[str, Callable[[Path], str]] = {
    "cnn_jit": export(cnn(), ints((1, 3, 32, 32), 3), frontend="jit"),
    "cnn_fx": export(cnn(), ints((1, 3, 32, 32), 3), frontend="fx"),
    "cnn_export": export(cnn(), ints((1, 3, 32, 32), 3), frontend="export"),
    "cnn_f16": export(cnn(), ints((1, 3, 32, 32), 3), precision="f16", check=False),
    "mlp_dynamic": export(mlp(), ints((3, 64), 4), dynamic_axes={"input": {0: "B"}}, input_names=["input"]),
    "mlp_q4_0": export(mlp(), ints((3, 64), 4), compress="q4_0"),
    "encoder_layer": export(
        dyadic(nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True), 9),
        ints((2, 5, 32), 10),
        frontend="fx",
    ),
    "gpt2_llm": gpt2_llm,
    "lattice_head": lattice_head,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bytes_unchanged(name: str, tmp_path: Path) -> None:
    assert CASES[name](tmp_path) == DIGESTS[name], f"{name}: the archive's bytes changed"


if __name__ == "__main__":  # re-record: prints the table to paste above
    import tempfile

    from tests import torchvision_shim

    torchvision_shim.install()  # as conftest does, before transformers imports torchvision

    with tempfile.TemporaryDirectory() as tmp:
        for name, case in CASES.items():
            (Path(tmp) / name).mkdir()
            print(f'    "{name}": "{case(Path(tmp) / name)}",')

"""``torchlower inspect`` / ``check`` on lattice folders, driven as a user would: a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from torchlower import lattice as L

pytest.importorskip("torchlower.fx", reason="lattice.save lowers through the FX front end")

MODEL = """
import torch
from torch import nn
from torchlower import lattice as L


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = L.SubmConv3d(3, 8, 3, bias=True)
        self.bn = L.BatchNorm(8)
        self.down = L.Conv3d(8, 8, 2, stride=2)
        self.g = L.GlobalAvgPool(2)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        y = torch.relu(self.bn(self.c(x)))
        return self.fc(self.g(self.down(y))), y


def make():
    torch.manual_seed(0)
    return Net()


def other():
    torch.manual_seed(1)
    return Net()
"""


def torchlower(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchlower", *args], cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, **env},
    )  # fmt: skip


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cli")
    (root / "netmod.py").write_text(MODEL)
    sys.path.insert(0, str(root))
    try:
        import netmod  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(root))
    coords = torch.cat([torch.randint(0, 2, (90, 1)), torch.randint(-4, 4, (90, 3))], dim=1)
    coords = torch.unique(coords, dim=0).int()
    x = L.SparseTensor(torch.randn(len(coords), 3), coords)
    L.save(netmod.make().eval(), root / "net", (x,), output_names=["logits", "feats"])
    np.savez(root / "in.npz", x_coords=coords.numpy(), x_features=x.feats.numpy(),
             x_active=np.array([len(coords)], dtype=np.int32))  # fmt: skip
    return root


def test_inspect_json_and_picture(folder: Path) -> None:
    done = torchlower("inspect", "net", "--json", "--svg", "net.svg", cwd=folder)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["format"] == "lattice" and data["ir_version"] == 2
    assert [(i["name"], i["role"]) for i in data["inputs"]] == [
        ("x_coords", "sparse_coords"),
        ("x_features", "sparse_features"),
        ("x_active", "sparse_active"),
    ]
    assert [(o["name"], o["role"]) for o in data["outputs"]] == [
        ("logits", "tensor"),
        ("feats", "sparse_tensor"),
    ]
    assert data["ops"]["subm_conv3d"] == 1 and data["ops"]["weight"] == 9
    assert data["weights"]["bytes_by_packing"] == {"dense f32": data["weights"]["bytes"]}
    assert len(data["sha256"]) == 64 and data["schema_digest"].startswith("1380f1e8")
    assert data["picture"]["nodes"] == 23 and (folder / "net.svg").read_text().startswith("<?xml")
    text = torchlower("inspect", "net", cwd=folder)
    assert text.returncode == 0 and "sparse_coords" in text.stdout and "sha256" in text.stdout


def test_pictures_without_graphviz(folder: Path) -> None:
    """No `dot` on PATH: SVG and PNG of a lattice folder come from the Python layout."""
    from PIL import Image

    for fmt in ("svg", "png"):
        done = torchlower(
            "inspect", "net", "--json", f"--{fmt}", f"net.{fmt}", cwd=folder, PATH="/nonexistent"
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["picture"]["nodes"] == 23
    assert "subm_conv3d" in (folder / "net.svg").read_text()
    assert Image.open(folder / "net.png").format == "PNG"


def test_check_against_the_model(folder: Path) -> None:
    done = torchlower("check", "net", "--model", "netmod.py:make", "--json", cwd=folder)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["random_inputs"] and data["reference"] == "model"
    assert [e["name"] for e in data["compared"]] == ["logits", "feats"]
    assert all(e["ok"] and e["max_abs"] < 1e-4 for e in data["compared"])
    given = torchlower("check", "net", "--model", "netmod.py:make", "--inputs", "in.npz", cwd=folder)
    assert given.returncode == 0 and "✓" in given.stdout and "random" not in given.stdout, given.stderr


def test_check_mismatch_and_bad_folders(folder: Path) -> None:
    wrong = torchlower("check", "net", "--model", "netmod.py:other", "--json", cwd=folder)
    assert wrong.returncode == 1, wrong.stderr
    data = json.loads(wrong.stdout)
    assert data["error"]["type"] == "CheckError" and not any(e["ok"] for e in data["outputs"])
    broken = folder / "broken"
    broken.mkdir()
    (broken / "graph.mlir").write_text("module attributes {\n  lattice.ir_version = 2,\n} {\n")
    (broken / "weights.safetensors").write_bytes(b"not safetensors")
    for cmd in ("inspect", "check"):
        done = torchlower(cmd, "broken", cwd=folder)
        assert done.returncode == 2, done.stderr
        assert "weights.safetensors" in done.stderr and "Traceback" not in done.stderr
    text = (folder / "net/graph.mlir").read_text()
    edits = {
        "kernel_size must have 3 entries": (
            "kernel_size = array<i64: 3, 3, 3>",
            "kernel_size = array<i64: 3, 3>",
        ),
        "unknown lattice ops ['wait']": ("= lattice.weight @c_weight", "= lattice.wait @c_weight"),
        "uses undefined values ['nowhere']": ("lattice.linear %g,", "lattice.linear %nowhere,"),
    }
    for i, (message, (old, new)) in enumerate(edits.items()):
        bad = folder / f"bad{i}"
        bad.mkdir()
        (bad / "graph.mlir").write_text(text.replace(old, new, 1))
        (bad / "weights.safetensors").write_bytes((folder / "net/weights.safetensors").read_bytes())
        done = torchlower("check", bad.name, "--model", "netmod.py:make", cwd=folder)
        assert done.returncode == 2 and message in done.stderr, done.stderr

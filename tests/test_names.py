"""Outputs named by their keys: dicts, nested dicts and Hugging Face ``ModelOutput``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchlower
import torchlower.artifact.io


class Flat(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        h = self.proj(x)
        return {"logits": h, "probs": h.softmax(-1)}


class Nested(Flat):
    def forward(self, x: torch.Tensor) -> dict[str, object]:  # type: ignore[override]
        h = self.proj(x)
        return {"logits": h, "extra": {"probs": h.softmax(-1), "hidden": torch.relu(h)}}


@pytest.mark.parametrize("frontend", ["jit", "fx", "export"])
def test_dict_outputs_are_named_by_their_keys(frontend: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, x = Flat().eval(), torch.randn(2, 4)
    report = torchlower.export(model, x, tmp_path / "d.nnef.tgz", frontend=frontend)
    assert [o.name for o in report.outputs] == ["logits", "probs"] and report.max_abs_error < 1e-5
    with torchlower.load(report.path) as art:
        out = art.run([x.numpy()])
    want = model(x)
    assert np.abs(out["probs"] - want["probs"].detach().numpy()).max() < 1e-5


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_nested_keys_are_joined_with_dots(frontend: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model, x = Nested().eval(), torch.randn(2, 4)
    report = torchlower.export(model, x, tmp_path / "n.nnef.tgz", frontend=frontend)
    assert [o.name for o in report.outputs] == ["logits", "extra.probs", "extra.hidden"]
    assert 'i"extra.probs" = ' in torchlower.artifact.io.graph_text(report.path)  # tract's escaped names
    info = torchlower.inspect(report.path)
    assert [o["name"] for o in info["outputs"]] == ["logits", "extra.probs", "extra.hidden"]
    out = torchlower.load(report.path).run([x.numpy()])
    want = model(x)["extra"]["hidden"].detach().numpy()
    assert np.abs(out["extra.hidden"] - want).max() < 1e-5


@pytest.mark.parametrize("frontend", ["jit", "export"])
def test_hugging_face_model_output_names(frontend: str, tmp_path: Path) -> None:
    """A ``return_dict=True`` model: ``prim::DictConstruct`` in jit, a pytree node in export."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=16,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    ids = torch.randint(0, 50, (1, 6))
    report = torchlower.export(model, (ids,), tmp_path / "bert.nnef.tgz", frontend=frontend)
    assert [o.name for o in report.outputs] == ["last_hidden_state", "pooler_output"]
    assert report.max_abs_error < 1e-4


class _Inner(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.det(x) + torch.special.zeta(x, x).sum()


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = nn.Sequential(nn.Identity(), _Inner())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


@pytest.mark.parametrize("frontend", ["jit", "fx", "export"])
def test_errors_name_module_and_source_line(frontend: str, tmp_path: Path) -> None:
    """Every front end names the model's own line (jit: its recorded stack; fx: the stack traces
    the tracer records), not torch's frames and not ``<top level>``."""
    from torchlower.errors import UnsupportedOpsError

    with pytest.raises(UnsupportedOpsError) as caught:
        torchlower.export(_Outer().eval(), torch.randn(2, 3, 3), tmp_path / "x.nnef.tgz", frontend=frontend)
    text = str(caught.value)
    line = _Inner.forward.__code__.co_firstlineno + 1
    assert f"aten::linalg_det ×1 (first used at block.1 (test_names.py:{line} in forward))" in text
    assert "aten::special_zeta" in text and not (tmp_path / "x.nnef.tgz").exists()


def test_torch_dumps_during_a_fallback_go_to_the_debug_log(tmp_path: Path) -> None:
    from tests.test_cli import cli

    args = ("export", "tests.cli_models:DataDependent", "-o", tmp_path / "d.nnef.tgz", "--input", "x:2x4")
    proc = cli(*args)  # every front end refuses the value-dependent branch (issue 13): exit 2
    assert proc.returncode == 2, proc.stderr
    assert "def forward" not in proc.stderr and "\x1b[" not in proc.stderr, proc.stderr[:2000]
    assert "export front end skipped" in proc.stderr and "cli_models.py" in proc.stderr
    debug = cli(*args, "-vv")
    assert "torch printed during torch.export" in debug.stderr and "def forward" in debug.stderr

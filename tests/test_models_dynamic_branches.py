"""transformers speech encoders whose sizes branch on the audio length (issue 28), tiny configs:

- SEW pads its upsampled output back to the encoder's length only when that length is odd
  (``if x.shape[1] < n: pad(...)``): the jit traces differ by that pad, which is aligned as a pad
  of 0 and lowered as *output size minus input size*, so the archive is right on both sides;
- Wav2Vec2-Conformer's relative shift slices ``[:, :, 1:]`` of a length that is ≥ 1 only where
  PyTorch runs: that lower bound is adopted, declared in the archive and checked at the bound.
"""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
import torch

import torchlower
from tests import torchvision_shim

TINY = dict(
    hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
    conv_dim=(16, 16, 16), conv_kernel=(10, 3, 3), conv_stride=(5, 2, 2),
    num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
)  # fmt: skip
CLASSES = {
    "sew": ("SEWConfig", "SEWModel"),
    "conformer": ("Wav2Vec2ConformerConfig", "Wav2Vec2ConformerModel"),
}


def _model(kind: str) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    torchvision_shim.install()
    torch.manual_seed(0)
    config, model = CLASSES[kind]
    return getattr(transformers, model)(getattr(transformers, config)(**TINY)).eval()


def _export(model: torch.nn.Module, tmp: Path) -> torchlower.ExportReport:
    return torchlower.export(
        model, torch.randn(1, 120), tmp / "m.nnef.tgz", input_names=["x"], dynamic_axes={"x": {1: "T"}},
        frontend="jit",
    )  # fmt: skip


def _checked(report: torchlower.ExportReport) -> list[int]:
    assert all(p.ok for p in report.points if not p.skipped), report.points
    return [p.inputs[0][1] for p in report.points if "=" in p.label and not p.skipped]


def _asserted(report: torchlower.ExportReport) -> list[str]:
    with tarfile.open(report.path) as archive:
        text = archive.extractfile("graph.nnef").read().decode()  # type: ignore[union-attr]
    return [line for line in text.splitlines() if line.startswith("extension tract_assert")]


def test_sew_pads_right_on_both_sides_of_its_length_branch(tmp_path: Path) -> None:
    model = _model("sew")
    frames = lambda t: int(model._get_feat_extract_output_lengths(torch.tensor(t)))  # noqa: E731
    assert frames(120) % 2 == 1  # the example's trace holds the pad
    report = _export(model, tmp_path)
    sizes = _checked(report)  # verified in tract at the example and these
    assert len(sizes) >= 2 and {frames(t) % 2 for t in [120, *sizes]} == {0, 1}, sizes
    assert report.max_abs_error < 1e-5, report.max_abs_error
    assert _asserted(report) == ["extension tract_assert T >= 60;"], report.notes  # its pool needs 2 frames


def test_conformer_adopts_the_length_pytorch_runs_from(tmp_path: Path) -> None:
    model = _model("conformer")
    with pytest.raises(RuntimeError):  # its last conv kernel is larger than the input below
        model(torch.randn(1, 39))
    report = _export(model, tmp_path)
    assert 40 in _checked(report), report.points
    assert any("T >= 40 adopted (PyTorch fails at T=39" in n for n in report.notes), report.notes
    assert _asserted(report) == ["extension tract_assert T >= 40;"]
    assert report.max_abs_error < 1e-5, report.max_abs_error

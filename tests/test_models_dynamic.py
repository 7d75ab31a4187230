"""Real package models with the axes users vary (issue 28): a transformers speech encoder over
any audio length, segmentation-models-pytorch and ultralytics YOLO over any batch and any image
size that is a multiple of their stride (32). Random weights, no hub download; each archive is
verified in tract at the example (batch 1, as users export) and at three other sizes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import torchlower
from tests import torchvision_shim


def _verified_at(report: torchlower.ExportReport, want: int = 3) -> list[str]:
    sizes = [p.label for p in report.points if "=" in p.label and p.ok and not p.skipped]
    assert all(p.ok for p in report.points if not p.skipped), report.points
    assert len(set(sizes)) >= want, (sizes, report.notes)
    return sizes


def _export(model: Any, x: torch.Tensor, axes: dict[int, str], tmp: Path, shapes: list[tuple[int, ...]]):
    """Export with ``axes`` dynamic; verified at the export's own points and again at ``shapes``
    (``torchlower.check`` with the model: its random inputs of those shapes against PyTorch)."""
    report = torchlower.export(model, x, tmp / "m.nnef.tgz", input_names=["x"], dynamic_axes={"x": axes})
    checked = _verified_at(report, want=1)
    for shape in shapes:
        result = torchlower.check(report.path, model=model, inputs=[torch.randn(*shape).numpy()])
        assert result.ok, result
        checked.append(str(shape))
    assert len(set(checked)) >= 3, checked
    return report


def test_wav2vec2_any_audio_length(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = transformers.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        conv_dim=(32,) * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
    )  # fmt: skip
    model = transformers.Wav2Vec2Model(config).eval()
    report = torchlower.export(
        model, torch.randn(1, 16000), tmp_path / "w.nnef.tgz", input_names=["x"], dynamic_axes={"x": {1: "T"}}
    )
    assert report.max_abs_error < 1e-4
    for length in (8123, 23456):  # far from the export's own points, odd lengths
        result = torchlower.check(report.path, model=model, inputs=[torch.randn(1, length).numpy()])
        assert result.ok, result


def test_smp_unet_any_batch_and_multiple_of_32(tmp_path: Path) -> None:
    smp = pytest.importorskip("segmentation_models_pytorch")
    torchvision_shim.install()
    torch.manual_seed(0)
    model = smp.Unet(
        "resnet18", encoder_weights=None, classes=2, encoder_depth=3, decoder_channels=(32, 16, 8)
    )
    axes = {0: "B", 2: "32*h", 3: "32*w"}
    _export(model.eval(), torch.randn(1, 3, 64, 96), axes, tmp_path, [(2, 3, 96, 64), (1, 3, 160, 128)])


def test_yolov8n_any_batch_and_multiple_of_32(tmp_path: Path) -> None:
    pytest.importorskip("ultralytics")
    torchvision_shim.install()
    from ultralytics.nn.tasks import DetectionModel

    torch.manual_seed(0)
    model = DetectionModel("yolov8n.yaml", verbose=False).eval()
    axes = {0: "B", 2: "32*h", 3: "32*w"}
    _export(model, torch.randn(1, 3, 128, 160), axes, tmp_path, [(2, 3, 96, 128), (1, 3, 224, 96)])


def test_smp_segformer_any_batch_and_multiple_of_32(tmp_path: Path) -> None:
    smp = pytest.importorskip("segmentation_models_pytorch")
    torchvision_shim.install()
    torch.manual_seed(0)
    model = smp.Segformer("mit_b0", encoder_weights=None, classes=2, decoder_segmentation_channels=32)
    axes = {0: "B", 2: "32*h", 3: "32*w"}
    _export(model.eval(), torch.randn(1, 3, 64, 96), axes, tmp_path, [(2, 3, 96, 64), (1, 3, 128, 160)])

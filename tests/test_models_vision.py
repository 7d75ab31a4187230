"""Real architectures, tiny and with random weights: one per torchvision / timm family the
held-out set refused (Swin, Swin-V2, MViTv2, RAFT, LeViT, MobileNetV3, EfficientNet).

torchvision 0.28.0 (the release pinned to torch 2.13.0) is published only as a CUDA build; its
``_C.so`` cannot load with the CPU torch. None of these models calls a torchvision C++ op, so
the import works once the two operator schemas torchvision registers fake kernels for
(``torchvision::nms`` / ``qnms``) are defined first with ``torch.library``
(``tests/torchvision_shim.py``, installed by conftest).
Batch norms get statistics from one training-mode pass, so activations (and the compared
outputs) are of order one instead of vanishing through a stack of random layers.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from types import ModuleType

import numpy as np
import pytest
import torch
from torch import nn

import torchlower
from tests import torchvision_shim


@cache
def _torchvision() -> ModuleType:
    torchvision_shim.install()
    try:
        import torchvision
    except (ImportError, OSError, RuntimeError) as exc:
        pytest.skip(f"torchvision cannot be imported: {exc}")
    return torchvision


def _timm() -> ModuleType:
    _torchvision()
    return pytest.importorskip("timm", reason="timm is not installed (requirements-dev.txt)")


def _swin(v2: bool) -> nn.Module:
    st = _torchvision().models.swin_transformer
    extra = {"block": st.SwinTransformerBlockV2, "downsample_layer": st.PatchMergingV2} if v2 else {}
    return st.SwinTransformer(
        patch_size=[4, 4], embed_dim=16, depths=[2, 2], num_heads=[1, 2], window_size=[4, 4],
        num_classes=10, **extra,
    )  # fmt: skip


def _mvit_v2() -> nn.Module:
    mvit = _torchvision().models.video.mvit
    blocks = [
        mvit.MSBlockConfig(num_heads=1, input_channels=16, output_channels=16, kernel_q=[3, 3, 3],
                           kernel_kv=[3, 3, 3], stride_q=[1, 1, 1], stride_kv=[1, 2, 2]),
        mvit.MSBlockConfig(num_heads=2, input_channels=16, output_channels=32, kernel_q=[3, 3, 3],
                           kernel_kv=[3, 3, 3], stride_q=[1, 2, 2], stride_kv=[1, 1, 1]),
    ]  # fmt: skip
    return mvit.MViT(
        spatial_size=(32, 32), temporal_size=4, block_setting=blocks, residual_pool=True,
        residual_with_cls_embed=False, rel_pos_embed=True, proj_after_attn=True, num_classes=10,
        patch_embed_kernel=(3, 7, 7), patch_embed_stride=(2, 4, 4), patch_embed_padding=(1, 3, 3),
    )  # fmt: skip


class _Raft(nn.Module):
    """raft_small's layout at a quarter of its widths, two refinement steps (grid_sample lookups)."""

    def __init__(self) -> None:
        super().__init__()
        raft = _torchvision().models.optical_flow.raft
        self.raft = raft._raft(
            weights=None, progress=False,
            feature_encoder_layers=(8, 8, 16, 24, 32), feature_encoder_block=raft.BottleneckBlock,
            feature_encoder_norm_layer=raft.InstanceNorm2d,
            context_encoder_layers=(8, 8, 16, 24, 40), context_encoder_block=raft.BottleneckBlock,
            context_encoder_norm_layer=None, corr_block_num_levels=4, corr_block_radius=3,
            motion_encoder_corr_layers=(24,), motion_encoder_flow_layers=(16, 8),
            motion_encoder_out_channels=22, recurrent_block_hidden_state_size=24,
            recurrent_block_kernel_size=(3,), recurrent_block_padding=(1,), flow_head_hidden_size=32,
            use_mask_predictor=False,
        )  # fmt: skip

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.raft(a, b, num_flow_updates=2)[-1]


def _mobilenet_v3() -> nn.Module:
    m = _torchvision().models.mobilenetv3
    settings, last = m._mobilenet_v3_conf("mobilenet_v3_small", width_mult=0.25)
    return m.MobileNetV3(settings, last, num_classes=10)


def _efficientnet() -> nn.Module:
    e = _torchvision().models.efficientnet
    settings, last = e._efficientnet_conf("efficientnet_b0", width_mult=0.25, depth_mult=0.25)
    return e.EfficientNet(settings, 0.2, last_channel=last, num_classes=10)


def _levit() -> nn.Module:
    """levit_128s's layout (three stages, subsampling attention between them) at tiny widths."""
    levit = _timm().models.levit
    return levit.Levit(
        img_size=64, num_classes=10, embed_dim=(32, 48, 64), key_dim=8, num_heads=(2, 3, 4), depth=(1, 1, 1)
    )


def _image(size: int = 64) -> tuple[torch.Tensor, ...]:
    return (torch.randn(1, 3, size, size),)


MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[], tuple[torch.Tensor, ...]]]] = {
    "swin": (lambda: _swin(False), lambda: _image(32)),
    "swin_v2": (lambda: _swin(True), lambda: _image(32)),
    "mvit_v2": (_mvit_v2, lambda: (torch.randn(1, 3, 4, 32, 32),)),
    "raft": (_Raft, lambda: (torch.randn(1, 3, 128, 128), torch.randn(1, 3, 128, 128))),
    "levit": (_levit, _image),
    "mobilenet_v3": (_mobilenet_v3, _image),
    "efficientnet": (_efficientnet, _image),
}


def _calibrated(model: nn.Module, args: tuple[torch.Tensor, ...]) -> nn.Module:
    """Linear layers at torch's default init (classifier heads start at N(0, 0.01), which makes
    the logits vanish), batch-norm statistics from one training pass on a batch of 4."""
    for m in model.modules():
        if isinstance(m, nn.Linear):
            m.reset_parameters()
    if any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
        model.train()
        with torch.no_grad():
            model(*[torch.cat([a] + [a + 0.5 * torch.randn_like(a) for _ in range(3)]) for a in args])
    return model.eval()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_vision_architecture(name: str, tmp_path, frontend, request) -> None:
    make, inputs = MODELS[name]
    args = inputs()
    model = _calibrated(make(), args)
    report = torchlower.export(model, args, tmp_path / "m.nnef.tgz", frontend=frontend)
    with torch.no_grad():
        want = model(*args)
    scale = float(want.abs().max())
    assert scale > 1e-3, f"degenerate output (max |y| = {scale}): the comparison would prove nothing"
    for err in report.errors:
        assert err.ok, f"{err.name}: max |torch - tract| = {err.max_abs}"
        assert err.max_abs <= 1e-4 * max(1.0, scale), (err.name, err.max_abs, scale)
    assert np.isfinite([e.max_abs for e in report.errors]).all()

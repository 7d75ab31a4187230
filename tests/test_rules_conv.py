from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.conftest import export_and_check

CONV = {
    "1d": (nn.Conv1d(4, 6, 3), (2, 4, 11)),
    "1d_stride_dil_pad": (nn.Conv1d(4, 6, 3, stride=2, padding=2, dilation=2), (2, 4, 13)),
    "1d_same_even_kernel": (nn.Conv1d(4, 6, 4, padding="same"), (2, 4, 11)),
    "1d_valid": (nn.Conv1d(4, 6, 3, padding="valid", bias=False), (2, 4, 11)),
    "2d": (nn.Conv2d(3, 8, 3, padding=1), (2, 3, 9, 10)),
    "2d_rect": (nn.Conv2d(3, 8, (3, 5), stride=(2, 1), padding=(0, 2), dilation=(1, 2)), (1, 3, 9, 10)),
    "2d_groups": (nn.Conv2d(4, 8, 3, groups=2), (1, 4, 7, 7)),
    "2d_depthwise": (nn.Conv2d(6, 6, 3, groups=6, padding=1, bias=False), (1, 6, 7, 7)),
    "2d_same_dilated": (nn.Conv2d(3, 5, 4, padding="same", dilation=2), (1, 3, 9, 8)),
    "2d_reflect": (nn.Conv2d(3, 5, 3, padding=2, padding_mode="reflect"), (1, 3, 8, 9)),
    "2d_replicate": (nn.Conv2d(3, 5, 3, padding=(1, 2), padding_mode="replicate"), (1, 3, 8, 9)),
    "2d_circular": (nn.Conv2d(3, 5, 3, padding=(2, 1), padding_mode="circular"), (1, 3, 8, 9)),
    "2d_unbatched": (nn.Conv2d(3, 5, 3), (3, 8, 9)),
    "3d": (nn.Conv3d(2, 4, 3, padding=1, stride=(1, 2, 1)), (1, 2, 5, 6, 7)),
    "3d_groups": (nn.Conv3d(4, 4, (1, 3, 3), groups=2), (1, 4, 3, 6, 6)),
}


@pytest.mark.parametrize("name", sorted(CONV))
def test_conv(tmp_path, frontend, name):
    model, shape = CONV[name]
    report = export_and_check(model, torch.randn(*shape), tmp_path, frontend, tolerance=1e-5)
    assert report.op_histogram["conv"] == 1


DECONV = {
    "1d": (nn.ConvTranspose1d(4, 6, 3, stride=2), (2, 4, 9)),
    "1d_output_padding": (nn.ConvTranspose1d(4, 6, 3, stride=2, padding=1, output_padding=1), (2, 4, 9)),
    "2d": (nn.ConvTranspose2d(3, 5, 3, stride=2, padding=1), (1, 3, 6, 7)),
    "2d_output_padding": (nn.ConvTranspose2d(3, 5, 3, stride=2, padding=1, output_padding=1), (1, 3, 6, 7)),
    "2d_output_padding_rect": (
        nn.ConvTranspose2d(3, 5, (3, 4), stride=(3, 2), padding=(1, 0), output_padding=(2, 1)),
        (1, 3, 5, 6),
    ),
    "2d_groups": (nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2), (1, 4, 5, 5)),
    "2d_dilation": (nn.ConvTranspose2d(3, 4, 3, stride=2, dilation=2, output_padding=1), (1, 3, 5, 5)),
    "2d_groups_dilation_output_padding": (
        nn.ConvTranspose2d(4, 4, 3, stride=3, groups=4, dilation=2, padding=2, output_padding=2, bias=False),
        (2, 4, 4, 5),
    ),
}


@pytest.mark.parametrize("name", sorted(DECONV))
def test_conv_transpose(tmp_path, frontend, name):
    model, shape = DECONV[name]
    report = export_and_check(model, torch.randn(*shape), tmp_path, frontend, tolerance=1e-5)
    assert report.op_histogram["deconv"] == 1


class Pad(nn.Module):
    def __init__(self, pad: tuple[int, ...], mode: str, value: float = 0.0) -> None:
        super().__init__()
        self.pad, self.mode, self.value = pad, mode, value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "constant":
            return F.pad(x, self.pad, value=self.value)
        return F.pad(x, self.pad, mode=self.mode)


@pytest.mark.parametrize(
    "pad, mode",
    [
        ((1, 2), "constant"),
        ((1, 2, 3, 0), "constant"),
        ((-1, 2, 0, -2), "constant"),
        ((2, 1, 1, 2), "reflect"),
        ((2, 1, 1, 2), "replicate"),
        ((2, 1, 3, 1), "circular"),
        ((1, 1), "constant"),
    ],
)
def test_pad(tmp_path, frontend, pad, mode):
    export_and_check(Pad(pad, mode, 1.5), torch.randn(2, 3, 5, 6), tmp_path, frontend)


def test_functional_conv_with_input_weight(tmp_path, frontend):
    class Dyn(nn.Module):
        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return F.conv2d(x, w, stride=2, padding=1)

    export_and_check(Dyn(), (torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3)), tmp_path, frontend)


def _classifier() -> nn.Module:
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True)]

    model = nn.Sequential(
        *block(3, 16),
        nn.MaxPool2d(2),
        *block(16, 32),
        nn.AvgPool2d(2),
        *block(32, 32),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(0.2),
        nn.Linear(32, 10),
    )
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2)
    return model


def test_image_classifier(tmp_path, frontend):
    report = export_and_check(_classifier(), torch.randn(2, 3, 32, 32), tmp_path, frontend)
    assert report.max_abs_error <= 1e-5, report.max_abs_error
    assert report.op_histogram["conv"] == 3 and report.op_histogram["matmul"] == 1

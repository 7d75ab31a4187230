"""interpolate / upsample in every mode, against PyTorch, with non-integer scales and sizes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.conftest import export_and_check
from tests.test_rules_math import Fn
from torchlower.errors import UnsupportedOpsError
from torchlower.rules import NNEF_RULES

RESIZES = [
    {"scale_factor": 2.0},
    {"scale_factor": 1.7},
    {"scale_factor": 0.6},
    {"scale_factor": (1.5, 0.75)},
    {"size": (11, 4)},
    {"size": (3, 13)},
    pytest.param(
        {"scale_factor": 1.3, "recompute_scale_factor": True},
        marks=pytest.mark.xfail(
            NNEF_RULES.lookup_function("aten::size.int") is None,
            reason="recompute_scale_factor reads x.size(): needs the shape family's aten::size rule",
            raises=UnsupportedOpsError,
            strict=True,
        ),
    ),
]


def _case_id(kwargs: dict | object) -> str:
    return "-".join(f"{k}={v}" for k, v in kwargs.items())


@pytest.mark.parametrize("resize", RESIZES, ids=_case_id)
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
def test_nearest_2d(tmp_path, frontend, mode, resize):
    x = torch.randn(2, 3, 7, 6)
    export_and_check(Fn(lambda t: F.interpolate(t, mode=mode, **resize)), x, tmp_path, frontend)


@pytest.mark.parametrize("resize", RESIZES, ids=_case_id)
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
def test_bilinear_bicubic(tmp_path, frontend, mode, align_corners, resize):
    x = torch.randn(2, 3, 7, 6)
    model = Fn(lambda t: F.interpolate(t, mode=mode, align_corners=align_corners, **resize))
    export_and_check(model, x, tmp_path, frontend)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("resize", [{"scale_factor": 0.45}, {"size": (5, 9)}], ids=_case_id)
def test_antialias(tmp_path, frontend, mode, resize):
    x = torch.randn(1, 2, 12, 10)
    model = Fn(lambda t: F.interpolate(t, mode=mode, antialias=True, align_corners=False, **resize))
    export_and_check(model, x, tmp_path, frontend)


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact", "linear"])
@pytest.mark.parametrize("resize", [{"scale_factor": 2.5}, {"scale_factor": 0.7}, {"size": 9}], ids=_case_id)
def test_1d(tmp_path, frontend, mode, resize):
    x = torch.randn(2, 3, 8)
    align = {"align_corners": True} if mode == "linear" else {}
    export_and_check(Fn(lambda t: F.interpolate(t, mode=mode, **resize, **align)), x, tmp_path, frontend)


@pytest.mark.parametrize("mode", ["nearest", "trilinear"])
@pytest.mark.parametrize("resize", [{"scale_factor": 1.5}, {"size": (3, 7, 5)}], ids=_case_id)
def test_3d(tmp_path, frontend, mode, resize):
    x = torch.randn(1, 2, 4, 5, 6)
    export_and_check(Fn(lambda t: F.interpolate(t, mode=mode, **resize)), x, tmp_path, frontend)


def test_upsample_modules(tmp_path, frontend):
    model = nn.Sequential(
        nn.Upsample(scale_factor=2, mode="nearest"),
        nn.UpsamplingBilinear2d(scale_factor=1.5),
    )
    report = export_and_check(model, torch.randn(1, 3, 5, 6), tmp_path, frontend)
    assert report.op_histogram["tract_core_gather"] == 2  # nearest: exact index gathers

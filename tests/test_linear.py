from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.conftest import export_and_check


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(3, 4), (2, 5, 4)])
def test_linear(tmp_path, frontend, bias, shape):
    model = nn.Sequential(nn.Linear(4, 8, bias=bias), nn.ReLU(), nn.Linear(8, 3, bias=bias))
    report = export_and_check(model, torch.randn(*shape), tmp_path, frontend)
    assert report.op_histogram["matmul"] == 2

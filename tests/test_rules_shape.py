from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.conftest import export_and_check
from torchlower.errors import LoweringError


class Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn
        self.register_buffer("c", torch.randn(2, 1, 4, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x, self.c)


CASES = {
    "reshape": lambda x, c: x.reshape(6, 20),
    "reshape_infer": lambda x, c: x.reshape(-1, 5),
    "view_size": lambda x, c: x.view(x.size(0), -1),
    "view_shape": lambda x, c: x.view(x.shape[0], x.shape[1], -1),
    "flatten": lambda x, c: torch.flatten(x, 1),
    "flatten_mid": lambda x, c: x.flatten(1, 2),
    "flatten_neg": lambda x, c: x.flatten(-2),
    "flatten_all": lambda x, c: x.flatten(),
    "permute": lambda x, c: x.permute(0, 3, 1, 2),
    "permute_neg": lambda x, c: x.permute(-1, 0, -2, 1),
    "transpose": lambda x, c: x.transpose(1, 3),
    "transpose_neg": lambda x, c: x.transpose(-1, -2).contiguous(),
    "t": lambda x, c: x.flatten(1).t(),
    "squeeze_all": lambda x, c: x.unsqueeze(0).unsqueeze(-1).squeeze(),
    "squeeze_dim": lambda x, c: x.unsqueeze(2).squeeze(2),
    "squeeze_dim_not_one": lambda x, c: x.squeeze(1),
    "squeeze_dims": lambda x, c: x.unsqueeze(0).unsqueeze(-1).squeeze((0, -1)),
    "unsqueeze_neg": lambda x, c: x.unsqueeze(-1),
    "cat": lambda x, c: torch.cat([x, x * 2], 1),
    "cat_neg_const": lambda x, c: torch.cat([x, x + 1, x], -2),
    "cat_buffer": lambda x, c: torch.cat([c, x], 1),
    "clone_detach": lambda x, c: x.clone().detach() + 1,
    "dropout": lambda x, c: nn.functional.dropout(x, 0.5, training=False) * 2,
    "to_double": lambda x, c: x.to(torch.float64) * 2,
    "to_int": lambda x, c: (x * 10).to(torch.int64),
    "type_as": lambda x, c: (x * 10).to(torch.int32).type_as(x),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_shape(tmp_path, frontend, name):
    x = torch.randn(2, 3, 4, 5)
    export_and_check(Fn(CASES[name]), x, tmp_path, frontend)


@pytest.mark.parametrize("module", [nn.Dropout(0.3), nn.Dropout2d(0.3), nn.AlphaDropout(0.3)])
def test_dropout_modules_are_identity(tmp_path, frontend, module):
    model = nn.Sequential(nn.Conv2d(3, 3, 1), module)
    report = export_and_check(model, torch.randn(1, 3, 4, 4), tmp_path, frontend)
    assert set(report.op_histogram) <= {"tract_core_external", "variable", "conv"}


def test_identities_emit_nothing(tmp_path, frontend):
    model = Fn(lambda x, c: x.contiguous().clone().detach().permute(0, 1, 2, 3).reshape(2, 3, 4, 5) + 1)
    report = export_and_check(model, torch.randn(2, 3, 4, 5), tmp_path, frontend)
    assert set(report.op_histogram) == {"tract_core_external", "add"}


def test_dropout_training_is_rejected(tmp_path, frontend):
    model = Fn(lambda x, c: nn.functional.dropout(x, 0.5, training=True))
    with pytest.raises(LoweringError, match="train"):
        export_and_check(model, torch.randn(2, 3), tmp_path, frontend)

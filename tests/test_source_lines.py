"""Every error's "first used at" names the model's own file and line (issue 30 item 9): an op
used in a helper module is that helper's line under each front end (torch.export records only
``forward`` frames unless told otherwise), an op inside a torch module is the model line that
called it, and never a file of torch, of torchlower or of the harness that called the export."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

import torchlower
from tests import source_lines_helpers
from torchlower.errors import UnsupportedOpsError

HELPER_LINE = next(
    i
    for i, t in enumerate(Path(source_lines_helpers.__file__).read_text().splitlines(), 1)
    if "HELPER LINE" in t
)


class UsesHelper(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return source_lines_helpers.odd(torch.relu(x))


class WrapsTorchModule(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pool = nn.FractionalMaxPool2d(2, output_size=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        return self.pool(y)  # MODEL LINE


MODEL_LINE = next(i for i, t in enumerate(Path(__file__).read_text().splitlines(), 1) if "# MODEL LINE" in t)
FRONTENDS = ["jit", "fx", "export", "auto"]


def _first_use(model: nn.Module, x: torch.Tensor, frontend: str, tmp_path: Path) -> list[str]:
    with pytest.raises(UnsupportedOpsError) as info:
        torchlower.export(model.eval(), (x,), tmp_path / "m.nnef.tgz", frontend=frontend)
    return re.findall(r"first used at ([^\n]*)\)", str(info.value))


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_op_in_a_helper_module_names_the_helper_line(frontend: str, tmp_path: Path) -> None:
    places = _first_use(UsesHelper(), torch.randn(3, 4), frontend, tmp_path)
    assert places and all(f"source_lines_helpers.py:{HELPER_LINE} in odd" in p for p in places), places


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_op_in_a_torch_module_names_the_model_line(frontend: str, tmp_path: Path) -> None:
    places = _first_use(WrapsTorchModule(), torch.randn(1, 1, 6, 6), frontend, tmp_path)
    assert places and all(f"test_source_lines.py:{MODEL_LINE} in forward" in p for p in places), places


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_never_a_torch_torchlower_or_harness_file(frontend: str, tmp_path: Path) -> None:
    """A torch module used as the whole model: no line of the user's is inside the call, so the
    module path alone (not this file's ``torchlower.export`` line, not torch's pooling.py)."""
    model = nn.Sequential(nn.Identity(), nn.FractionalMaxPool2d(2, output_size=2))
    places = _first_use(model, torch.randn(1, 1, 6, 6), frontend, tmp_path)
    assert places and not any(".py" in p for p in places), places

"""Tie groups in the check (issue 32): rankings of tied values are no false alarm, a wrong
archive with ties still fails.

``topk`` of equal values has no defined order; tract 0.23.9 returns tied elements in ascending
index order where torch's CPU kernel does not. Where tract's indices are a model output and pick
values tied with torch's, PyTorch is run again with tract's order and compared plainly; else
gathered outputs compare as multisets per tie group (``pipeline/ties.py``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchlower
from torchlower.errors import CheckError


class Head(nn.Module):
    """An RT-DETR-like head: class scores of every query, the top k, their labels and boxes.
    Logits rounded to halves, so many scores tie exactly (at random points too)."""

    def __init__(self, k: int = 10, indices: bool = True) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.k, self.indices = k, indices
        self.cls, self.box = nn.Linear(8, 4), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        scores = (torch.round(self.cls(x) * 2) / 2).sigmoid().flatten(1)
        values, index = scores.topk(self.k, dim=1)
        query = torch.div(index, 4, rounding_mode="floor")
        boxes = self.box(x).gather(1, query.unsqueeze(-1).expand(-1, -1, 4))
        return (values, index, index % 4, boxes) if self.indices else (values, boxes)


class TopK(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        values, index = torch.topk(x, 5, dim=-1)
        return values, index


def tied(report: torchlower.ExportReport) -> list[str]:
    return [e.name for e in report.errors if e.tied]


def test_topk_over_repeated_values(frontend: str, tmp_path: Path) -> None:
    x = torch.tensor([[1.0, 2.0, 2.0, 0.0, 2.0, 1.0, 2.0, 1.0, 0.0, 2.0, 1.0, 2.0]] * 3)
    report = torchlower.export(TopK().eval(), x, tmp_path / "t.nnef.tgz", frontend=frontend)
    assert tied(report) == ["output_1"], "tract kept torch's order of ties: the test proves nothing"
    assert "tract's order of tied values (topk)" in (report.errors[1].note or "")
    assert report.errors[0].max_abs == 0.0  # the values themselves compare as numbers
    assert all(p.ok for p in report.points if p.skipped is None)


def test_detector_head_with_tied_scores(frontend: str, tmp_path: Path) -> None:
    model, x = Head().eval(), torch.randn(2, 30, 8)
    report = torchlower.export(model, x, tmp_path / "h.nnef.tgz", frontend=frontend)
    assert set(tied(report)) >= {"output_1", "output_2", "output_3"}
    assert all(p.ok for p in report.points if p.skipped is None) and len(report.points) == 5


def test_tied_rows_without_indices_compare_per_tie_group(tmp_path: Path) -> None:
    model, x = Head(k=120, indices=False).eval(), torch.randn(2, 30, 8)  # every query: no group cut by k
    report = torchlower.export(model, x, tmp_path / "g.nnef.tgz", frontend="jit")
    boxes = [e for e in report.errors if e.tied]
    assert boxes and all("tie group" in (e.note or "") for e in boxes)


@pytest.mark.parametrize("weight", ["box.weight", "cls.weight.folded"])
def test_a_wrong_archive_with_ties_still_fails(weight: str, tmp_path: Path) -> None:
    model, x = Head().eval(), torch.randn(2, 30, 8)
    path = tmp_path / "w.nnef"
    torchlower.export(model, x, path, frontend="jit")
    assert torchlower.check(path, [x.numpy()], model=model).ok
    dat = path / f"{weight}.dat"
    data = bytearray(dat.read_bytes())
    values = np.frombuffer(bytes(data[128:]), dtype="<f4").copy()
    values[:8] += 0.75  # the first row: other boxes, or other scores and so another ranking
    data[128:] = values.tobytes()
    dat.write_bytes(bytes(data))
    with pytest.raises(CheckError, match="tract disagrees"):
        torchlower.check(path, [x.numpy()], model=model)

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from tests.conftest import export_and_check


class Bag(nn.Module):
    """EmbeddingBag with offsets either baked into the model or passed as a graph input."""

    def __init__(self, offsets: torch.Tensor | None, weighted: bool = False, **kwargs) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(11, 5, **kwargs)
        self.register_buffer("offsets", offsets)
        self.weighted, self.fixed = weighted, offsets is not None

    def forward(self, indices, offsets_or_weights=None, weights=None):
        if self.fixed:
            offsets, weights = self.offsets, offsets_or_weights
        else:
            offsets = offsets_or_weights
        return self.bag(indices, offsets, per_sample_weights=weights if self.weighted else None)


class OneHot(nn.Module):
    def __init__(self, classes: int) -> None:
        super().__init__()
        self.classes = classes

    def forward(self, x):
        return F.one_hot(x, self.classes)


@pytest.mark.parametrize("shape", [(7,), (2, 3), (2, 3, 4)])
def test_embedding(tmp_path, frontend, shape):
    model = nn.Embedding(13, 6, padding_idx=0)
    indices = torch.randint(0, 13, shape)
    report = export_and_check(model, indices, tmp_path, frontend)
    assert report.op_histogram["tract_core_gather"] == 1


def test_embedding_then_linear(tmp_path, frontend):
    model = nn.Sequential(nn.Embedding(20, 8), nn.Linear(8, 3))
    export_and_check(model, torch.tensor([[1, 19, 0], [4, 4, 7]]), tmp_path, frontend)


@pytest.mark.parametrize("classes", [4, 9])
@pytest.mark.parametrize("shape", [(5,), (2, 3)])
def test_one_hot(tmp_path, frontend, classes, shape):
    report = export_and_check(OneHot(classes), torch.randint(0, 4, shape), tmp_path, frontend)
    assert report.outputs[0].dtype == "int64"


INDICES = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 10])


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("offsets_as_input", [False, True])
@pytest.mark.parametrize(
    ("offsets", "last"),
    [
        (torch.tensor([0, 3, 3, 7]), False),  # an empty bag in the middle
        (torch.tensor([0, 2, 5, 10]), True),
    ],
)
def test_embedding_bag(tmp_path, frontend, mode, offsets_as_input, offsets, last):
    model = Bag(None if offsets_as_input else offsets, mode=mode, include_last_offset=last)
    args = (INDICES, offsets) if offsets_as_input else (INDICES,)
    export_and_check(model, args, tmp_path, frontend)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_padding_idx(tmp_path, frontend, mode):
    model = Bag(torch.tensor([0, 3, 6]), mode=mode, padding_idx=4)
    export_and_check(model, (INDICES,), tmp_path, frontend)


@pytest.mark.parametrize("offsets_as_input", [False, True])
def test_embedding_bag_per_sample_weights(tmp_path, frontend, offsets_as_input):
    offsets = torch.tensor([0, 4, 5])
    model = Bag(None if offsets_as_input else offsets, weighted=True, mode="sum")
    weights = torch.rand(len(INDICES))
    args = (INDICES, offsets, weights) if offsets_as_input else (INDICES, weights)
    export_and_check(model, args, tmp_path, frontend)


class RowBags(nn.Module):
    """2-D input: one bag per row (the module builds the offsets)."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.bag = nn.EmbeddingBag(11, 5, mode=mode, padding_idx=2)

    def forward(self, indices):
        return self.bag(indices)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_2d(tmp_path, frontend, mode):
    export_and_check(RowBags(mode), torch.tensor([[1, 2, 3], [2, 2, 2], [4, 10, 0]]), tmp_path, frontend)

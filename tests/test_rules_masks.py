"""Data-dependent sizes tract runs (issue 30 item 6): ``nonzero``, boolean-mask indexing and
``masked_select`` on masks computed in the graph (``tract_onnx_non_zero``), checked through each
front end at the example and at random inputs whose True counts differ; ``unique`` (no tract
op) refused with a typed error naming the line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import torchlower
from tests.conftest import Fn, export_and_check
from torchlower.errors import LoweringError

EDGES = torch.tensor([[0, 1, 2, 3, 3, 5, 6, 2], [1, 1, 3, 3, 4, 5, 0, 7]])


def _self_loops_removed(edge_index: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    kept = edge_index[:, edge_index[0] != edge_index[1]]  # torch_geometric.utils.remove_self_loops
    return kept, x[kept[0]].sum(0)


CASES = {
    "self_loops": (_self_loops_removed, (EDGES, torch.randn(8, 4))),
    "nonzero": (lambda x: torch.nonzero(x > 0.3), (torch.randn(3, 5),)),
    "nonzero_1d": (lambda x: (x > 0).nonzero().squeeze(1) * 2, (torch.randn(9),)),
    "masked_select": (lambda x: torch.masked_select(x, x < 0) + 1, (torch.randn(3, 5),)),
    "masked_select_broadcast": (
        lambda x, m: torch.masked_select(x, m > 0),
        (torch.randn(3, 5), torch.randn(5)),
    ),
    "mask_all_dims": (lambda x: x[x > 1.0], (torch.randn(4, 6),)),
    "mask_on_axis_1": (lambda x: x[:, x[0] > 0] * 3, (torch.randn(3, 7),)),
    "mask_two_dims": (lambda x: x[:, x[0] > 0], (torch.randn(2, 3, 4, 5),)),
    "two_masks": (lambda x: (x[x > 0].sum(), x[x < -0.5].sum()), (torch.randn(6, 4),)),
}


@pytest.mark.parametrize("case", CASES)
def test_data_dependent_size(case: str, frontend: str, tmp_path: Path) -> None:
    fn, args = CASES[case]
    report = export_and_check(Fn(fn), args, tmp_path, frontend=frontend)
    assert report.max_abs_error < 1e-5
    assert sum(p.ok for p in report.points) >= 3, report.points  # random inputs: other True counts


def test_archive_runs_at_other_counts(tmp_path: Path) -> None:
    out = tmp_path / "m.nnef.tgz"
    torchlower.export(Fn(_self_loops_removed).eval(), (EDGES, torch.randn(8, 4)), out)
    model = torchlower.load(out)
    for loops in (0, 3, 8):
        e = torch.randint(0, 8, (2, 8))
        e[1, :loops] = e[0, :loops]
        e[1, loops:] = (e[0, loops:] + 1) % 8
        x = torch.randn(8, 4)
        got = model.run([e, x])
        kept, total = _self_loops_removed(e, x)
        assert got["output_0"].shape == (2, 8 - loops)
        assert got["output_0"].tolist() == kept.tolist()
        assert abs(got["output_1"] - total.numpy()).max() < 1e-5


@pytest.mark.parametrize("frontend", ["jit", "fx", "export"])
def test_unique_is_refused_naming_the_line(frontend: str, tmp_path: Path) -> None:
    with pytest.raises(LoweringError, match=r"no unique op") as info:
        torchlower.export(
            Fn(lambda x: torch.unique(x)).eval(), (torch.tensor([3, 1, 3, 2]),), tmp_path / "m.nnef.tgz",
            frontend=frontend,
        )  # fmt: skip
    assert re.search(r"test_rules_masks\.py:\d+", str(info.value)), str(info.value)


def test_mask_with_another_index_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LoweringError, match="supported alone"):
        torchlower.export(
            Fn(lambda x, i: x[i, x[0] > 0]).eval(), (torch.randn(3, 4), torch.tensor([0, 2])),
            tmp_path / "m.nnef.tgz", frontend="jit",
        )  # fmt: skip

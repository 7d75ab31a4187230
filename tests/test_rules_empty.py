"""Zero-size tensors in tract vs PyTorch: ``topk(k=0)``, empty slices / splits / diagonals / masks,
``cat`` with empty parts, and sums / means over an axis of size 0.

tract runs zero-size tensors (its ``topk`` with ``k = 0``, ``slice`` ``n:n``, ``concat`` and
``matmul`` with an empty part), except that ``sum_reduce`` / ``mean_reduce`` over a size-0 axis
abort the process (``nnef/guards.py:empty_reductions``, regression-tested here by ``e.sum``).
Two models with several outputs each keep this to two exports per front end.
"""

from __future__ import annotations

import pytest
import torch

import torchlower
from tests.conftest import export_and_check


class Empties(torch.nn.Module):
    """Every form at once; the empty results are graph outputs, so their shapes are checked too."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("none", torch.zeros(3, 4, dtype=torch.bool))

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> tuple[torch.Tensor, ...]:
        top = torch.topk(x, 0, dim=1)
        pieces = torch.tensor_split(x, [0, 2], dim=1)
        return (
            top.values * 2,
            top.indices,
            torch.cat([x[:, 2:2], x, e], 1) + 1,  # an empty slice and an empty input dropped by cat
            pieces[0] - 1,
            pieces[1] + 1,
            torch.cat([x.diagonal(7), torch.masked_select(x, self.none), x[0]]) * 3,
            e.sum(1) + x[:, 0],  # guard: tract's sum over a size-0 axis divides by zero
            e.mean(1),  # torch's NaN, not an abort
            e.long().sum(1),
            e.prod(1),
            e @ torch.ones(0, 2),  # an empty contraction is zeros
        )


def test_empty_tensors(tmp_path, frontend):
    report = export_and_check(Empties(), (torch.randn(3, 4), torch.randn(3, 0)), tmp_path, frontend)
    assert len(report.outputs) == 11 and all(e.max_abs == 0.0 for e in report.errors)
    assert {"aten::topk", "aten::sum.dim_IntList", "aten::mean.dim"} <= set(report.rules_used)


class DynamicEmpties(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return torch.topk(x, 0, dim=1).values + 1, x[:, 3:3] * 2, torch.cat([x[:, 1:1], x], 1)


@pytest.mark.parametrize("frontend", ["jit", "export"])  # fx fits sizes like jit, at the same cost
def test_empty_tensors_with_a_dynamic_batch(tmp_path, frontend):
    """The empty results keep the symbolic batch (a real ``n:n`` slice, not a constant)."""
    report = torchlower.export(
        DynamicEmpties().eval(), (torch.randn(3, 4),), tmp_path / "m.nnef.tgz", frontend=frontend,
        dynamic_axes={"x": {0: "B"}},
    )  # fmt: skip
    sizes = {p.inputs[0] for p in report.points if p.skipped is None}
    assert len(sizes) > 1, sizes  # checked at other batch sizes too
    assert report.errors and all(e.ok and e.max_abs == 0.0 for e in report.errors)

"""In-place ops on intermediates nobody else reads become functional in the torch.export graph
(``frontends/export_inplace.py``), so the program is not traced a second time by
``run_decompositions``; writes through views and mismatched overloads are left alone."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.conftest import Fn, export_and_check
from torchlower.frontends.export_inplace import functional_in_place


def _targets(fn: object, *args: torch.Tensor) -> list[str]:
    program = torch.export.export(Fn(fn), args, strict=False)  # type: ignore[arg-type]
    functional_in_place(program)
    return [str(n.target) for n in program.graph.nodes if n.op == "call_function"]


def _residual(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    y = x @ w
    y += x  # Falcon's ``mlp_output += attention_output``
    return y.relu()


def test_unobserved_add_becomes_add(tmp_path: Path) -> None:
    x, w = torch.randn(2, 3, 8), torch.randn(8, 8)
    assert "aten.add.Tensor" in _targets(_residual, x, w) and "aten.add_.Tensor" not in _targets(
        _residual, x, w
    )
    report = export_and_check(Fn(_residual), (x, w), tmp_path, "export")
    assert report.errors and all(e.ok for e in report.errors)


def test_writes_that_others_see_stay_in_place() -> None:
    def through_view(x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y[0].add_(1.0)  # the write reaches y
        return y

    def read_later(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = x * 2
        z = y.sum()
        y.mul_(3.0)
        return y, z

    x = torch.randn(3, 4)
    assert "aten.add_.Tensor" in _targets(through_view, x)
    assert "aten.mul_.Scalar" in _targets(read_later, x) or "aten.mul_.Tensor" in _targets(read_later, x)
    # pow_.Scalar's functional twin is pow.Tensor_Scalar, not pow.Scalar (other argument types)
    assert not any(t == "aten.pow.Scalar" for t in _targets(lambda t: (t * 1).pow_(3), x))

"""Python autograd Functions under every front end (issue 30, item 5).

``torch.jit.trace`` records a ``torch.autograd.Function`` as an opaque ``prim::PythonOp``;
the jit front end traces through its ``forward`` instead (inference needs no backward), so
Bloom's GELU and custom activations export like any other ops, in both Function styles.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import torchlower


class BloomGelu(torch.autograd.Function):
    """transformers' Bloom ``GeLUFunction``: ctx-style, saves its input for backward."""

    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)  # type: ignore[attr-defined]
        return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors  # type: ignore[attr-defined]
        return grad * (x > 0)


class ScaledRelu(torch.autograd.Function):
    """New style: ``forward`` without ctx, ``setup_context`` separately; a non-tensor argument."""

    @staticmethod
    def forward(x: torch.Tensor, k: float) -> torch.Tensor:
        return x.clamp(min=0) * k

    @staticmethod
    def setup_context(ctx: object, inputs: tuple, output: torch.Tensor) -> None:
        ctx.k = inputs[1]  # type: ignore[attr-defined]

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.k, None  # type: ignore[attr-defined]


class InPlaceClip(torch.autograd.Function):
    @staticmethod
    def forward(ctx: object, x: torch.Tensor) -> torch.Tensor:
        x.clamp_(-1.0, 1.0)
        ctx.mark_dirty(x)  # type: ignore[attr-defined]
        return x

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
        return grad


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(5, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = ScaledRelu.apply(BloomGelu.apply(self.linear(x)), 3.0)
        return InPlaceClip.apply(y * 1)


@pytest.mark.parametrize("frontend", ["jit", "fx", "export"])
def test_functions_are_traced_through(frontend: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Model().eval()
    report = torchlower.export(model, torch.randn(2, 5), tmp_path / "m.nnef.tgz", frontend=frontend)
    assert report.frontend == frontend and report.max_abs_error < 1e-5
    assert "tanh" in report.op_histogram and "PythonOp" not in str(report.op_histogram)


def test_functions_with_a_dynamic_axis_under_jit(tmp_path: Path) -> None:
    report = torchlower.export(
        Model().eval(),
        torch.randn(1, 5),
        tmp_path / "m.nnef.tgz",
        frontend="jit",
        dynamic_axes={"x": {0: "B"}},
    )
    assert report.inputs[0].shape == ("B", 5)
    assert all(p.ok for p in report.points if p.skipped is None) and any(
        "B=" in p.label for p in report.points
    )


def test_autograd_still_works_after_export(tmp_path: Path) -> None:
    """The inlining lasts only while tracing: training the model afterwards still runs backward."""
    model = Model()
    torchlower.export(model, torch.randn(2, 5), tmp_path / "m.nnef.tgz", frontend="jit")
    x = torch.randn(3, 5, requires_grad=True)
    BloomGelu.apply(x).sum().backward()
    with torch.no_grad():
        assert torch.equal(x.grad, (x > 0).float()), "BloomGelu's own backward ran"

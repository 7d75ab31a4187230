"""Models whose trace would depend on tensor values never get a ✓ (issue 13).

A jit trace freezes a Python value taken from a tensor (a branch, a scale, a loop count) at the
example's value; such traces are refused with ``ValueDependentTraceError`` naming the source
line, in every front end, unless the user opts in — and then the check on random inputs still
catches a branch that does change.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchlower
from torchlower.errors import CheckError, TorchlowerError, ValueDependentTraceError


class Branch(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return -x


class Scale(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / float(x.abs().max())


class Item(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * x.mean().item()


class ToList(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + x[0, 0].tolist()


class Loop(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(int(x.abs().sum()) % 3 + 1):
            x = x + 1
        return x


class While(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        while bool(x.abs().max() > 1):
            x = x / 2
        return x


CASES = {
    Branch: "if x.sum() > 0:",
    Scale: "return x / float(x.abs().max())",
    Item: "return x * x.mean().item()",
    ToList: "return x + x[0, 0].tolist()",
    Loop: "for _ in range(int(x.abs().sum()) % 3 + 1):",
    While: "while bool(x.abs().max() > 1):",
}


@pytest.mark.parametrize("model", list(CASES), ids=lambda m: m.__name__)
def test_jit_refuses_a_value_dependent_trace(model: type[nn.Module], tmp_path: Path) -> None:
    with pytest.raises(ValueDependentTraceError) as info:
        torchlower.export(model().eval(), torch.randn(2, 5) * 3, tmp_path / "m.nnef.tgz", frontend="jit")
    text = str(info.value)
    assert "test_value_dependence.py:" in text and CASES[model] in text
    assert "torch.where" in text and "allow_value_dependent_trace=True" in text
    assert not (tmp_path / "m.nnef.tgz").exists()


@pytest.mark.parametrize("model", list(CASES), ids=lambda m: m.__name__)
def test_auto_names_the_line_and_gives_no_artifact(model: type[nn.Module], tmp_path: Path) -> None:
    with pytest.raises(ValueDependentTraceError, match=r"torch\.where") as info:
        torchlower.export(model().eval(), torch.randn(2, 5) * 3, tmp_path / "m.nnef.tgz")
    assert CASES[model] in str(info.value)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "export front end skipped" in notes and "jit front end skipped" in notes
    assert not (tmp_path / "m.nnef.tgz").exists()


@pytest.mark.parametrize("frontend", ["fx", "export"])
@pytest.mark.parametrize("model", list(CASES), ids=lambda m: m.__name__)
def test_fx_and_export_never_verify_it(model: type[nn.Module], frontend: str, tmp_path: Path) -> None:
    with pytest.raises(TorchlowerError):
        torchlower.export(model().eval(), torch.randn(2, 5) * 3, tmp_path / "m.nnef.tgz", frontend=frontend)


def test_export_names_the_line(tmp_path: Path) -> None:
    with pytest.raises(ValueDependentTraceError, match=r"test_value_dependence\.py:\d+: `if x.sum\(\) > 0:`"):
        torchlower.export(Branch().eval(), torch.randn(2, 5), tmp_path / "m.nnef.tgz", frontend="export")


class Sizes(nn.Module):
    """Converts sizes (tensors while tracing) and parameter values: the trace stays correct."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = int(x.shape[1]) // 2
        return x[:, :half] * float(self.scale) + x.new_zeros(1).sum().item()


def test_sizes_and_parameters_are_not_value_dependence(tmp_path: Path) -> None:
    report = torchlower.export(Sizes().eval(), torch.randn(2, 6), tmp_path / "m.nnef.tgz", frontend="jit")
    assert report.checked and not any("value-dependent" in n for n in report.notes)


class ConstantBranch(nn.Module):
    """The branch is value-dependent but never taken for sensible inputs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.abs().max() > 1e9:
            x = x / 1e9
        return x + 1


def test_opt_in_accepts_a_constant_branch_and_says_so(tmp_path: Path) -> None:
    with pytest.raises(ValueDependentTraceError):
        torchlower.export(ConstantBranch(), torch.randn(2, 5), tmp_path / "m.nnef.tgz", frontend="jit")
    report = torchlower.export(
        ConstantBranch(), torch.randn(2, 5), tmp_path / "m.nnef.tgz", frontend="jit",
        allow_value_dependent_trace=True,
    )  # fmt: skip
    assert any("value-dependent jit trace accepted" in n and "x.abs().max() > 1e9" in n for n in report.notes)


def test_opt_in_still_catches_a_branch_that_changes(tmp_path: Path) -> None:
    """The example takes one side; random inputs with the example's spread take the other."""
    x = torch.tensor([[0.5, -0.2, 0.1, 0.3, -0.1]])
    with pytest.raises(CheckError, match="random"):
        torchlower.export(
            Branch(), x, tmp_path / "m.nnef.tgz", frontend="jit", allow_value_dependent_trace=True
        )


def test_opt_in_must_be_a_bool(tmp_path: Path) -> None:
    with pytest.raises(torchlower.errors.InvalidArgumentError, match="allow_value_dependent_trace"):
        torchlower.export(Branch(), torch.randn(2), tmp_path / "m.nnef.tgz", allow_value_dependent_trace=1)


class SkipsAllOnes(nn.Module):
    """transformers' pattern: a fast path read from the mask's values, taken only when not tracing."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if bool(torch.tensor(x.shape[-1]) > mask.shape[-1]):  # a size check: a tracer warning, no value
            mask = torch.nn.functional.pad(mask, (0, 1))
        if not torch.jit.is_tracing() and bool((mask == 1).all()):
            return x * 2
        return x * 2 * mask


def test_a_value_read_only_when_not_tracing_needs_no_opt_in(tmp_path: Path) -> None:
    """The trace takes the general path, and so does the eager witness (``is_tracing`` is True
    there too): no value dependence, and the artifact is right for masks with zeros as well."""
    x, ones = torch.randn(2, 5), torch.ones(2, 5)
    report = torchlower.export(SkipsAllOnes(), (x, ones), tmp_path / "m.nnef.tgz", frontend="jit")
    assert report.checked and report.frontend == "jit"
    mask = torch.tensor([[1.0, 1, 0, 0, 1], [0, 1, 1, 1, 1]])
    with torchlower.load(report.path) as art:
        got = art.run({"x": x.numpy(), "mask": mask.numpy()})["output"]
    assert np.abs(got - (x * 2 * mask).numpy()).max() == 0.0  # ×2 and ×0/1: exact on any CPU

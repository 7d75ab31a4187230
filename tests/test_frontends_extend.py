"""User extension points: module rules (kept as FX leaves) and function rules, in every front end."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import torchlower
from tests.conftest import export_and_check
from torchlower.core.values import Value, constant
from torchlower.errors import InvalidArgumentError, UnsupportedOpsError
from torchlower.frontends.fx import trace
from torchlower.rules.common import Builder, channel_param


# ---- a user module the FX tracer cannot trace through (shape control flow) -------------------
class ScaleShift(nn.Module):
    """y = x * scale + shift over the last dim; the rank check defeats symbolic tracing."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.randn(n))
        self.shift = nn.Parameter(torch.randn(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() < 2:
            raise ValueError("expects a batch")
        return x * self.scale + self.shift


class ScaleShiftChild(ScaleShift):
    """Found through the MRO: the base class's module rule applies."""


@torchlower.register_module_rule(ScaleShift)
def scale_shift(b: Builder, module: ScaleShift, x: Value) -> Value:
    """ScaleShift(x) = x * scale + shift"""
    scale = channel_param(constant(module.scale.detach()), x.rank, axis=-1)
    shift = channel_param(constant(module.shift.detach()), x.rank, axis=-1)
    y = b.call("mul", [x, scale], dtype=x.dtype, shape=x.shape)
    return b.call("add", [y, shift], dtype=x.dtype, shape=x.shape)


class WithScaleShift(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 6)
        self.norm = ScaleShiftChild(6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.norm(self.lin(x)))


def test_module_rule_keeps_user_module_as_leaf(tmp_path):
    model = WithScaleShift().eval()
    gm = trace(model)
    leaves = [n.target for n in gm.graph.nodes if n.op == "call_module"]
    assert leaves == ["norm"], leaves  # Linear traced through, ScaleShiftChild kept whole
    report = export_and_check(model, torch.randn(3, 4), tmp_path, "fx")
    # the user rule ran (its mul/add may then be folded into the linear by the graph passes)
    assert "tests.test_frontends_extend.ScaleShift" in report.rules_used, report.rules_used


def test_module_rule_for_the_whole_model(tmp_path):
    report = export_and_check(ScaleShift(5), torch.randn(2, 5), tmp_path, "fx")
    assert report.op_histogram["mul"] == 1


def test_duplicate_rules_are_rejected():
    with pytest.raises(InvalidArgumentError, match="already registered"):
        torchlower.register_module_rule(ScaleShift)(scale_shift)
    with pytest.raises(InvalidArgumentError, match="already registered"):
        torchlower.register_function_rule("tltest::scale2")(scale2_rule)


# ---- a custom op with a user function rule: the same rule in jit, fx and export -------------
@torch.library.custom_op("tltest::scale2", mutates_args=())
def scale2(x: torch.Tensor, factor: float) -> torch.Tensor:
    return x * factor


@scale2.register_fake
def _scale2_fake(x: torch.Tensor, factor: float) -> torch.Tensor:
    return torch.empty_like(x)


@torchlower.register_function_rule("tltest::scale2")
def scale2_rule(b: Builder, x: Value, factor: float) -> Value:
    """tltest::scale2(Tensor x, float factor) -> Tensor"""
    return b.call("mul", [x, float(factor)], dtype=x.dtype, shape=x.shape)


class UsesScale2(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(scale2(x, 3.0))


def test_function_rule_for_custom_op(tmp_path, frontend):
    report = export_and_check(UsesScale2(), torch.randn(2, 3), tmp_path, frontend)
    assert report.op_histogram["mul"] == 1


# ---- a function rule keyed by a Python callable: FX keeps the call whole ---------------------
@torch.library.custom_op("tltest::opaque", mutates_args=())
def opaque(x: torch.Tensor) -> torch.Tensor:
    """An op no front end can lower: only the wrapping Python function's rule makes it work."""
    return x.clone()


@opaque.register_fake
def _opaque_fake(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def shifted_relu(x: torch.Tensor, shift: float = 0.5) -> torch.Tensor:
    return torch.relu(opaque(x) - shift)


@torchlower.register_function_rule(shifted_relu)
def shifted_relu_rule(b: Builder, x: Value, shift: float) -> Value:
    """shifted_relu(x, shift) = relu(x - shift)"""
    y = b.call("sub", [x, float(shift)], dtype=x.dtype, shape=x.shape)
    return b.call("relu", [y], dtype=x.dtype, shape=x.shape)


class UsesShiftedRelu(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return shifted_relu(x, shift=0.25) + shifted_relu(x)


def test_python_function_rule_is_autowrapped():
    gm = trace(UsesShiftedRelu())
    calls = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert calls.count(shifted_relu) == 2


def test_auto_falls_back_to_fx_with_notes(tmp_path):
    model = nn.Sequential(nn.Linear(3, 3), _Wrap(lambda x: shifted_relu(x, 0.1)))
    report = torchlower.export(model.eval(), torch.randn(2, 3), tmp_path / "m.nnef.tgz")
    assert report.frontend == "fx"
    assert [n.split(" ")[0] for n in report.notes] == ["export", "jit"]
    assert all("tltest::opaque" in n for n in report.notes), report.notes
    assert report.errors and all(e.ok for e in report.errors)


class _Wrap(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x)


# ---- every missing op at once ---------------------------------------------------------------
@torch.library.custom_op("tltest::missing_a", mutates_args=())
def missing_a(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@torch.library.custom_op("tltest::missing_b", mutates_args=())
def missing_b(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


@torch.library.custom_op("tltest::missing_c", mutates_args=())
def missing_c(x: torch.Tensor) -> torch.Tensor:
    return x.clone()


for _op in (missing_a, missing_b, missing_c):
    _op.register_fake(lambda x: torch.empty_like(x))


class ThreeMissing(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = missing_a(x)
        b = missing_b(torch.relu(a))  # downstream of a missing op: still reported
        return missing_c(b)


def test_three_unsupported_ops_in_one_error(tmp_path, frontend):
    with pytest.raises(UnsupportedOpsError) as info:
        torchlower.export(ThreeMissing(), torch.randn(2, 3), tmp_path / "m.nnef.tgz", frontend=frontend)
    ops = {o.op.split(".")[0] for o in info.value.ops}
    assert {"tltest::missing_a", "tltest::missing_b", "tltest::missing_c"} <= ops, ops
    assert info.value.frontend == frontend

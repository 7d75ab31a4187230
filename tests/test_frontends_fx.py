"""The FX / export front ends: lower_fx, argument binding to ATen schemas, auto selection."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlower
from tests.conftest import export_and_check
from torchlower.core.values import Value, constant
from torchlower.errors import LoweringError
from torchlower.frontends.fx import lower_fx
from torchlower.frontends.pycalls import resolve_function, resolve_method
from torchlower.nnef import archive
from torchlower.nnef.builder import NNEFBuilder
from torchlower.nnef.tract import run_in_tract


def test_lower_fx_with_explicit_builder_and_inputs(tmp_path):
    model = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2)).eval()
    builder = NNEFBuilder()
    x = builder.add_input("features", torch.float32, (3, 4))
    assert lower_fx(builder, model, [x], output_names=["scores"]) is builder
    path = archive.write(tmp_path / "m.nnef.tgz", builder.graph_text(), builder.live_weights())
    example = torch.randn(3, 4)
    (actual,) = run_in_tract(path, [example.numpy()])
    torch.testing.assert_close(torch.from_numpy(actual), model(example).detach(), atol=1e-5, rtol=1e-5)
    assert "scores" in builder.graph_text() and "label = '0.weight'" in builder.graph_text()


def test_lower_fx_defaults_to_declared_inputs_and_rejects_non_tensor_outputs():
    class Both(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
            return torch.relu(x), x.shape[0]

    builder = NNEFBuilder()
    builder.add_input("x", torch.float32, (2, 3))
    with pytest.raises(LoweringError, match="int"):
        lower_fx(builder, Both())


class InPlace(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        y.relu_()  # the result is unused: later reads of y must see it
        return y


def test_inplace_method_rebinds_its_operand(tmp_path, frontend):
    export_and_check(InPlace(), torch.randn(5, 3), tmp_path, frontend)


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) if x.sum() > 0 else torch.relu(-x)


def test_auto_refuses_a_value_dependent_model_that_only_jit_could_trace(tmp_path):
    """jit would freeze the branch (issue 13): no front end is left, the error names the line."""
    x = torch.ones(2, 3)
    with pytest.raises(torchlower.errors.ValueDependentTraceError, match=r"if x\.sum\(\) > 0") as info:
        torchlower.export(DataDependent(), x, tmp_path / "m.nnef.tgz")
    assert any(n.startswith("export front end skipped") for n in info.value.__notes__)


def test_auto_uses_jit_when_export_fails(tmp_path):
    report = torchlower.export(DataDependent(), torch.ones(2, 3), tmp_path / "m.nnef.tgz",
                               allow_value_dependent_trace=True)  # fmt: skip
    assert report.frontend == "jit"
    assert report.notes[0].startswith("export front end skipped: ValueDependentTraceError")
    assert any("value-dependent jit trace accepted" in n for n in report.notes)


def test_auto_prefers_export(tmp_path):
    report = torchlower.export(nn.Sequential(nn.Linear(2, 2)).eval(), torch.randn(1, 2), tmp_path / "m.nnef")
    assert report.frontend == "export" and report.notes == []


def test_unknown_frontend_is_rejected(tmp_path):
    with pytest.raises(torchlower.errors.InvalidArgumentError, match="auto"):
        torchlower.export(nn.ReLU(), torch.randn(2), tmp_path / "m.nnef", frontend="onnx")


# ---- Python-level calls bound to ATen schemas (what every rule receives) --------------------
X = Value("x", torch.float32, (2, 3, 4))
W = constant(torch.ones(4))


@pytest.mark.parametrize(
    ("call", "key", "args"),
    [
        (lambda: resolve_method("view", (X, 6, -1), {}), "aten::view", [X, [6, -1]]),
        (lambda: resolve_method("permute", (X, 2, 0, 1), {}), "aten::permute", [X, [2, 0, 1]]),
        (lambda: resolve_method("softmax", (X,), {"dim": -1}), "aten::softmax.int", [X, -1, None]),
        (lambda: resolve_method("sum", (X,), {}), "aten::sum", [X, None]),
        (lambda: resolve_method("mean", (X, 1), {"keepdim": True}), "aten::mean.dim", [X, [1], True, None]),
        (lambda: resolve_method("float", (X,), {}), "aten::to.dtype", [X, torch.float32, False, False, None]),
        (lambda: resolve_function(torch.relu, (X,), {}), "aten::relu", [X]),
        (lambda: resolve_function(F.relu, (X,), {"inplace": False}), "aten::relu", [X]),
        (lambda: resolve_function(operator.add, (X, 2), {}), "aten::add.Scalar", [X, 2, 1]),
        (lambda: resolve_function(operator.mul, (2, X), {}), "aten::mul.Scalar", [X, 2]),
        (lambda: resolve_function(operator.sub, (2, X), {}), "aten::rsub.Scalar", [X, 2, 1]),
        (lambda: resolve_function(torch.cat, ([X, X],), {"dim": 1}), "aten::cat", [[X, X], 1]),
        (
            lambda: resolve_function(F.batch_norm, (X, W, W), {"weight": W, "bias": W, "eps": 1e-3}),
            "aten::batch_norm",
            [X, W, W, W, W, False, 0.1, 1e-3, True],
        ),
        (
            lambda: resolve_function(F.max_pool2d, (X, 2), {"stride": None, "return_indices": False}),
            "aten::max_pool2d",
            [X, [2, 2], [], [0, 0], [1, 1], False],
        ),
        (
            lambda: resolve_function(F.dropout, (X, 0.1), {"training": False, "inplace": False}),
            "aten::dropout",
            [X, 0.1, False],
        ),
        (
            lambda: resolve_function(torch.ops.aten.linear.default, (X, W), {}),
            "aten::linear",
            [X, W, None],
        ),
    ],
)
def test_calls_bind_to_schema_order(call, key, args):
    bound = call().bound
    assert bound is not None and bound.key == key
    assert len(bound.args) == len(args)
    for got, want in zip(bound.args, args, strict=True):
        assert got is want if isinstance(want, Value) else got == want


def test_inplace_functional_maps_to_the_functional_op():
    call = resolve_function(F.relu, (X,), {"inplace": True})
    assert call.inplace and call.bound is not None and call.bound.key == "aten::relu"


def test_python_only_argument_off_default_is_an_error():
    with pytest.raises(LoweringError, match="max_norm"):
        resolve_function(F.embedding, (X, W), {"max_norm": 1.0})


class _GradBlocks(nn.Module):
    """``torch.no_grad()`` / ``enable_grad()`` inside forward: torch.export wraps each block in a
    ``wrap_with_set_grad_enabled`` higher-order op over a nested graph (PhiMoE's router)."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            y = self.proj(x).relu()
        with torch.enable_grad():
            z = y * 2 - x
        return z + x.sigmoid()


@pytest.mark.parametrize("frontend", ["jit", "fx", "export"])
def test_grad_mode_blocks_in_forward_lower_inline(tmp_path, frontend):
    export_and_check(_GradBlocks(), [torch.randn(3, 4)], tmp_path, frontend)

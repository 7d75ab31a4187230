"""Torch functions on a SparseTensor's features: eager, lowering, reference executor, errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchlower import lattice as L
from torchlower.errors import UnsupportedOpsError

pytest.importorskip("torchlower.fx", reason="lattice.save lowers through the FX front end")


def cloud(n: int = 90, channels: int = 6) -> L.SparseTensor:
    coords = torch.cat([torch.randint(0, 2, (n, 1)), torch.randint(-4, 4, (n, 3))], dim=1)
    coords = torch.unique(coords, dim=0).int()
    return L.SparseTensor(torch.randn(len(coords), channels), coords)


class Functional(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c = L.SubmConv3d(6, 6, 3, bias=True)
        self.ln_weight = nn.Parameter(torch.rand(6) + 0.5)
        self.ln_bias = nn.Parameter(torch.randn(6))

    def forward(self, x):
        y = torch.relu(self.c(x))
        y = F.gelu(y, approximate="tanh") + F.silu(y)
        y = torch.sigmoid(y) * 2.0 - 0.5
        y = F.layer_norm(0.5 * y, (6,), self.ln_weight, self.ln_bias, 1e-5)
        y = F.rms_norm(torch.tanh(y) / 4, (6,), eps=None)
        z = torch.exp(F.leaky_relu(y, 0.1)) + torch.round(3 * y)
        return F.softmax(-z, dim=-1), F.softplus(z, beta=2.0, threshold=5.0)


def test_functional_ops_eager_lower_and_reference(tmp_path: Path) -> None:
    model = Functional().eval()
    x = cloud()
    report = L.save(model, tmp_path / "f", (x,))
    text = (report.path / "graph.mlir").read_text()
    for kind in ("relu", "gelu", "silu", "sigmoid", "tanh", "leaky_relu", "softplus"):
        assert f"kind = #lattice.activation<{kind}>" in text
    assert 'kind = "exp"' in text and 'kind = "round"' in text
    assert "lattice.softmax" in text and "lattice.layer_norm" in text and "lattice.rms_norm" in text
    assert text.count("lattice.sparse.decompose") == text.count("lattice.sparse.with_features") > 10
    assert "%relu = lattice.sparse.with_features %c, %relu_features" in text
    assert 'storage_key = "ln_weight"' in text  # the functional norm's parameter, under its path
    assert "eps = 1.1920928955078125e-07 : f32" in text  # rms_norm(eps=None): float32's eps
    assert all(e.ok for e in report.errors) and report.max_abs_error < 1e-4, report.errors
    print("functional ops: reference vs eager", [(e.name, e.max_abs) for e in report.errors])


def test_unsupported_function_names_the_lattice_registry(tmp_path: Path) -> None:
    class Erf(nn.Module):
        def forward(self, x):
            return torch.erf(torch.relu(x))

    with pytest.raises(UnsupportedOpsError) as err:
        L.save(Erf().eval(), tmp_path / "e", (cloud(),))
    text = str(err.value)
    assert "aten::erf" in text and "lattice lowering rule" in text
    assert "torchlower.lattice.register_function_rule" in text


def test_user_rule_through_the_lattice_extension_point(tmp_path: Path) -> None:
    from torchlower.lattice.rules import LATTICE_RULES
    from torchlower.lattice.rules_functional import scalar_affine

    def shift(x, by: float = 1.0):
        return x + by

    @L.register_function_rule(shift)
    def shift_rule(b, x, by):
        return scalar_affine(b, x, 1.0, by)

    class Shifted(nn.Module):
        def forward(self, x):
            return shift(x, 3.0)

    try:
        report = L.save(Shifted().eval(), tmp_path / "s", (cloud(),))
        assert (
            all(e.ok for e in report.errors)
            and "lattice.batch_norm" in (report.path / "graph.mlir").read_text()
        )
    finally:
        del LATTICE_RULES.functions[shift]


def test_torch_function_on_unaligned_sparse_tensors_is_refused() -> None:
    from torchlower.errors import InvalidArgumentError

    a, b = cloud(), cloud()
    assert torch.equal(torch.mul(a, a).feats, a.feats * a.feats)  # same voxels: row by row
    with pytest.raises(InvalidArgumentError, match="different voxels"):
        torch.mul(a, b)

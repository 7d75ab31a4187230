"""precision="f16": weights and compute in f16, f32 at the boundary, checked against the f32 model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchlower
from tests.models_compress import CNN, MLP, Block

FRONTENDS = ("jit", "export")
CASES = {
    "mlp": (MLP, lambda: torch.randn(4, 64)),
    "cnn": (CNN, lambda: torch.randn(2, 3, 8, 8)),
    "block": (Block, lambda: torch.randn(2, 8, 64)),
}


@pytest.mark.parametrize(
    ("case", "frontend"),
    [(c, f) for c in sorted(CASES) for f in FRONTENDS],
)
def test_f16_export_runs_in_f16_and_matches_f32_model(case: str, frontend: str, tmp_path: Path) -> None:
    make, example = CASES[case]
    model, x = make().eval(), example()
    full = torchlower.export(model, x, tmp_path / "f32.nnef.tgz", frontend=frontend)
    half = torchlower.export(model, x, tmp_path / "f16.nnef.tgz", frontend=frontend, precision="f16")
    assert half.precision == "f16" and half.errors
    with torch.no_grad():
        scale = float(model(x).abs().max())
    assert half.points[0].label == "example" and len(half.points) >= 4
    for err in half.points[0].errors:
        assert err.ok and err.tolerance == pytest.approx(1e-2 * max(1.0, scale))
        assert err.max_abs > 0.0, "f16 compute that matches f32 exactly was not done in f16"
    assert all(e.ok for e in half.errors)  # the random points too, each with its own scale
    assert half.weight_bytes * 2 == full.weight_bytes
    info = torchlower.inspect(half.path)
    assert set(info["weights"]["bytes_by_dtype"]) == {"float16"}
    assert info["inputs"][0]["dtype"] == "float32"  # the caller feeds and gets f32
    assert all(o["dtype"] == "float32" for o in info["outputs"])
    art = torchlower.load(half.path)
    assert "tract_core_cast" in art.graph.op_histogram()


def test_f16_softmax_is_computed_in_f32(tmp_path: Path) -> None:
    model, x = Block().eval(), torch.randn(1, 4, 64)
    report = torchlower.export(model, x, tmp_path / "b.nnef", frontend="jit", precision="f16")
    text = (report.path / "graph.nnef").read_text()
    line = next(i for i, row in enumerate(text.splitlines()) if " softmax(" in row)
    rows = text.splitlines()
    source = rows[line].split("softmax(")[1].split(",")[0]
    assert any(r.strip().startswith(f"{source} = tract_core_cast(") and "'f32'" in r for r in rows)


def test_unknown_precision_is_refused(tmp_path: Path) -> None:
    with pytest.raises(torchlower.errors.InvalidArgumentError, match="precision"):
        torchlower.export(MLP().eval(), torch.randn(1, 64), tmp_path / "m.nnef.tgz", precision="bf16")

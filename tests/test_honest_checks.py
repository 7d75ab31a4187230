"""The check runs beyond the one example, reports every point, and never hides an error (issue 13).

Multi-point verification (example + random inputs like it), the user's model and RNG left alone,
compression errors shown both ways with export and ``check --model`` agreeing, and option
combinations that used to drop an option silently.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchlower
from tests.models_compress import MLP
from tests.test_cli import cli, cli_json
from torchlower.errors import CheckError, InvalidArgumentError
from torchlower.pipeline import verification


def test_export_checks_the_example_and_three_random_points(tmp_path: Path) -> None:
    model, x = MLP().eval(), torch.randn(4, 64)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    params = [id(p) for p in model.parameters()]
    torch.manual_seed(123)
    rng = torch.get_rng_state()
    report = torchlower.export(model, x, tmp_path / "m.nnef.tgz", frontend="jit")
    assert torch.equal(torch.get_rng_state(), rng), "the user's RNG state moved"
    assert [id(p) for p in model.parameters()] == params
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    labels = [p.label for p in report.points]
    randoms = ["random 1 (seed 1301)", "random 2 (seed 1302)", "random 3 (seed 1303)"]
    assert labels == ["example", *randoms, "special values"]
    assert report.points[-1].skipped is not None and "NaN" in report.points[-1].skipped  # NaN spreads
    checked = report.points[:-1]
    assert all(p.ok and len(p.errors) == 1 and p.errors[0].max_abs < 1e-4 for p in checked)
    assert [e.name for e in report.errors] == ["output"] + [f"output ({label})" for label in randoms]
    again = torchlower.export(model, x, tmp_path / "n.nnef.tgz", frontend="jit")
    assert [p.errors for p in again.points] == [p.errors for p in report.points]  # fixed seeds


def test_random_points_resemble_the_example() -> None:
    g = torch.Generator().manual_seed(0)
    image = torch.rand(2, 3, 32, 32) * 4 + 1  # all positive, mean 3
    drawn = verification.like(image, g)
    assert drawn.dtype == image.dtype and drawn.shape == image.shape and (drawn >= 0).all()
    assert abs(float(drawn.mean()) - 3.0) < 0.3 and not torch.equal(drawn, image)
    centred = torch.randn(1000) * 5 - 2
    drawn = verification.like(centred, g)
    assert abs(float(drawn.mean()) + 2) < 0.6 and abs(float(drawn.std()) - 5) < 0.6 and (drawn < 0).any()
    ids = torch.tensor([[3, 7, 7, 9, 3]])
    drawn = verification.like(ids, g)
    assert drawn.dtype == torch.int64 and int(drawn.min()) >= 3 and int(drawn.max()) <= 9
    perm = torch.tensor([4, 0, 3, 1, 2])  # distinct values (an index): shuffled, still distinct
    assert sorted(verification.like(perm, g).tolist()) == [0, 1, 2, 3, 4]
    mask = torch.ones(64, dtype=torch.bool)
    assert verification.like(mask, g).dtype == torch.bool and not verification.like(mask, g).all()
    zeros = torch.zeros(100)
    assert verification.like(zeros, g).std() > 0.5  # a constant example still gets varied inputs
    first = [verification.like(image, torch.Generator().manual_seed(5)) for _ in range(2)]
    assert torch.equal(first[0], first[1])


class Nonzero(nn.Module):
    """An output whose shape depends on the values: wrong for most inputs if frozen."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[x > 0] * 2


@pytest.mark.parametrize("frontend", ["jit", "fx", "export"])
def test_value_dependent_output_shape_is_never_frozen(frontend: str, tmp_path: Path) -> None:
    """The count of ``x > 0`` is a size tract computes at run time (``tract_onnx_non_zero``,
    rules/masks.py): never the example's count frozen into the graph."""
    report = torchlower.export(
        Nonzero().eval(), torch.randn(3, 4), tmp_path / "m.nnef.tgz", frontend=frontend
    )
    assert isinstance(report.outputs[0].shape[0], str), report.outputs  # a symbol, not the example's count
    with torchlower.load(report.path) as art:
        for count in (0, 5, 12):
            x = torch.full((3, 4), -1.0)
            x.view(-1)[:count] = torch.arange(1.0, count + 1)
            got = art.run([x.numpy()])["output"]
            assert got.shape == (count,) and (got == (x[x > 0] * 2).numpy()).all(), count


def test_a_point_where_pytorch_fails_is_skipped_and_said(tmp_path: Path) -> None:
    model, x = MLP().eval(), torch.randn(2, 64)
    report = torchlower.export(model, x, tmp_path / "m.nnef.tgz", check=False)
    seen = []

    def reference(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        seen.append(inputs)
        if len(seen) == 2:
            raise RuntimeError("no such input, says the model")
        return [model(*inputs)]

    points = [verification.Point("example", (x,)), *verification.random_points((x,))]
    outcome = verification.check_points(report.path, points, reference, ["y"], lambda want: 1e-4)
    assert [p.skipped is not None for p in outcome.points] == [False, True, False, False]
    assert "no such input" in str(outcome.points[1].skipped) and not outcome.points[1].ok
    assert len(outcome.errors()) == 3


def test_a_wrong_point_names_itself(tmp_path: Path) -> None:
    model, x = MLP().eval(), torch.randn(2, 64)
    report = torchlower.export(model, x, tmp_path / "m.nnef.tgz", check=False)

    def off_at_random_points(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        out = model(*inputs)
        return [out if torch.equal(inputs[0], x) else out + 1]

    points = [verification.Point("example", (x,)), *verification.random_points((x,))]
    with pytest.raises(CheckError, match=r"output \(random 1 \(seed 1301\)\): max abs 1") as info:
        verification.check_points(report.path, points, off_at_random_points, ["output"], lambda w: 1e-4)
    assert len(info.value.errors) == 3


# ---- compression: both errors shown, export and check agree ------------------------------
def test_q4_0_cli_shows_both_errors_and_check_agrees(tmp_path: Path) -> None:
    out = tmp_path / "q.nnef.tgz"
    data = cli_json("export", "tests.cli_models:q4_mlp", "-o", out, "--input", "x:4x64", "--compress", "q4_0")
    assert data["comparison"].startswith("model with the dequantized q4_0 weights")
    assert len(data["points"]) == 5 and all(e["ok"] and e["max_abs"] < 1e-4 for e in data["errors"])
    assert len(data["original_errors"]) == 4
    assert all(e["max_abs"] > 1e-3 and "max_rel" in e for e in data["original_errors"])
    checked = cli_json("check", out, "--model", "tests.cli_models:q4_mlp")
    assert "dequantized q4_0 weights" in checked["comparison"] and len(checked["points"]) == 5
    assert all(e["ok"] for e in checked["errors"]) and len(checked["original_errors"]) == 4
    table = cli("check", out, "--model", "tests.cli_models:q4_mlp")
    assert table.returncode == 0 and "quality loss" in table.stdout and "dequantized" in table.stdout
    text = cli("export", "tests.cli_models:q4_mlp", "-o", out, "--input", "x:4x64", "--compress", "q4_0")
    assert "vs original output" in text.stdout and "random 3" in text.stdout


def test_check_model_on_f16_archive_uses_the_f16_tolerance(tmp_path: Path) -> None:
    model, x = MLP().eval(), torch.randn(4, 64)
    report = torchlower.export(model, x, tmp_path / "h.nnef.tgz", precision="f16")
    result = torchlower.check(report.path, [x.numpy()], model=model)
    assert result.ok and len(result.points) == 5  # given, 3 random, special values
    assert result.errors[0].tolerance == pytest.approx(report.errors[0].tolerance)


def test_check_model_with_other_weights_compares_with_the_plain_model(tmp_path: Path) -> None:
    report = torchlower.export(MLP().eval(), torch.randn(4, 64), tmp_path / "q.nnef.tgz", compress="q4_0")
    torch.manual_seed(7)
    other = MLP().eval()
    with pytest.raises(CheckError, match="not the model's parameter quantized"):
        torchlower.check(report.path, model=other)


def test_q4_0_with_f16_composes(tmp_path: Path) -> None:
    model, x = MLP().eval(), torch.randn(4, 64)
    report = torchlower.export(model, x, tmp_path / "q.nnef.tgz", compress="q4_0", precision="f16")
    assert set(report.weight_bytes_by_format) == {"q4_0", "float16"}  # Q4 weights, f16 biases
    assert all(e.ok for e in report.errors) and report.original_errors
    art = torchlower.load(report.path)
    assert any(a.op == "tract_core_cast" and a.attrs.get("to") == "f16" for a in art.graph.assignments)
    assert torchlower.check(report.path, [x.numpy()], model=model).ok


def test_q4_0_with_dynamic_axes_checks_other_sizes(tmp_path: Path) -> None:
    model, x = MLP().eval(), torch.randn(4, 64)
    report = torchlower.export(
        model, x, tmp_path / "q.nnef.tgz", compress="q4_0", dynamic_axes={"input": {0: "B"}}
    )
    assert {"B=2", "B=8"} <= {p.label for p in report.points}
    assert all(p.ok for p in report.points if p.label != "special values")


# ---- no option is dropped silently --------------------------------------------------------
def test_tolerance_without_check_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="check=False"):
        torchlower.export(MLP(), torch.randn(1, 64), tmp_path / "m.nnef.tgz", check=False, tolerance=1e-3)


@pytest.mark.parametrize("frontend", ["fx", "export"])
def test_value_dependent_opt_in_only_where_it_means_something(frontend: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=r"applies to torch\.jit\.trace"):
        torchlower.export(
            MLP(), torch.randn(1, 64), tmp_path / "m.nnef.tgz", frontend=frontend,
            allow_value_dependent_trace=True,
        )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["export", "tests.cli_models:mlp", "-o", "{out}", "--input", "x:2x8", "--trust"], "needs --weights"),
        (["export", "tests.cli_models:mlp", "-o", "{out}", "--input", "x:2x8", "--no-check",
          "--tolerance", "1"], "--no-check"),
        (["export", "tests.cli_models:mlp", "-o", "{out}", "--inputs", "{npz}", "--seed", "3"], "no effect"),
        (["check", "{art}", "--tolerance", "1"], "needs something to compare"),
        (["check", "{art}", "--inputs", "{npz}", "--symbol", "B=3"], "no effect"),
    ],
)  # fmt: skip
def test_cli_refuses_options_it_would_ignore(args: list[str], match: str, tmp_path: Path) -> None:
    npz = tmp_path / "in.npz"
    np.savez(npz, x=np.zeros((2, 8), np.float32))
    art = tmp_path / "a.nnef.tgz"
    torchlower.export(MLP(), torch.randn(1, 64), art)
    filled = [a.format(out=tmp_path / "o.nnef.tgz", npz=npz, art=art) for a in args]
    proc = cli(*filled, "--json")
    assert proc.returncode == 2, proc.stderr
    assert match in json.loads(proc.stdout)["error"]["message"]

"""Reading artifacts back: load / inspect / check on real exports, tract-written and hand-written graphs."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchlower
from torchlower.errors import ArtifactError, CheckError, InvalidArgumentError
from torchlower.nnef import dat
from torchlower.nnef.parse import Expr, Ident, parse

W_ROW = np.array([1.0, 2.0, 3.0], np.float32)
SYMBOLIC = """version 1.0;
extension tract_registry tract_core;
extension tract_symbol B;

# a comment
graph network(x) -> (y)
{
    x = tract_core_external(shape = [B, 3], datum_type = 'f32');
    w = variable<scalar>(label = 'weights/w', shape = [1, 3]);
    y = add(x, w);
}
"""


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3)).eval()


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[nn.Module, torch.Tensor, Path, torchlower.ExportReport]:
    torch.manual_seed(0)
    model, x = mlp(), torch.randn(2, 4)
    path = tmp_path_factory.mktemp("exp") / "m.nnef.tgz"
    return model, x, path, torchlower.export(model, x, path, check=False)


def symbolic_dir(tmp_path: Path) -> Path:
    d = tmp_path / "sym.nnef"
    (d / "weights").mkdir(parents=True)
    (d / "graph.nnef").write_text(SYMBOLIC)
    (d / "weights" / "w.dat").write_bytes(dat.encode(np.array([[1.0, 2.0, 3.0]], np.float32)))
    return d


def test_load_gives_the_model_weights(exported):
    model, _, path, report = exported
    art = torchlower.load(path)
    assert art.kind == "tgz" and art.input_names == ["input"] and art.output_names == ["output"]
    params = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    assert set(art.weights) == set(params)
    for label, array in art.weights.items():
        np.testing.assert_array_equal(array.reshape(-1), params[label].reshape(-1))
    assert art.graph.op_histogram() == report.op_histogram


def test_inspect_is_json_and_complete(exported):
    _, _, path, report = exported
    info = json.loads(json.dumps(torchlower.inspect(path)))
    assert info["inputs"] == [{"name": "input", "shape": [2, 4], "dtype": "float32"}]
    assert info["outputs"] == [{"name": "output", "shape": [2, 3], "dtype": "float32"}]
    assert info["ops"] == dict(report.op_histogram)
    assert info["weights"]["bytes"] == report.weight_bytes == info["weights"]["bytes_by_format"]["float32"]
    assert info["extensions"] == ["tract_registry tract_core"] and info["symbols"] == []


def test_check_against_model_expected_and_random(exported):
    model, x, path, _ = exported
    res = torchlower.check(path, inputs=[x], model=model)
    assert res.ok and res.errors[0].max_abs < 1e-5
    want = model(x).detach().numpy()
    assert torchlower.check(path, inputs={"input": x.numpy()}, expected=[want]).ok
    with pytest.raises(CheckError) as info:
        torchlower.check(path, inputs=[x], expected=[want + 0.5])
    assert info.value.errors[0].max_abs == pytest.approx(0.5, abs=1e-4)
    rand = torchlower.check(path, model=model)  # random inputs from the declared shape
    assert rand.inputs[0].shape == (2, 4) and rand.ok


@pytest.mark.parametrize(
    ("inputs", "match"),
    [
        ([np.zeros((2, 4), np.float64)], "declared f32 but got float64"),
        ([np.zeros((3, 4), np.float32)], r"shape \[3, 4\]"),
        ([np.zeros((2, 4), np.float32)] * 2, "2 inputs for 1"),
        ({"x": np.zeros((2, 4), np.float32)}, "missing"),
    ],
)
def test_check_bad_inputs(exported, inputs, match):
    with pytest.raises(InvalidArgumentError, match=match):
        torchlower.check(exported[2], inputs=inputs)


def test_check_symbolic_dims(tmp_path):
    d = symbolic_dir(tmp_path)
    info = torchlower.inspect(d)
    assert info["inputs"][0]["shape"] == ["B", 3] and info["symbols"] == ["B"]
    res = torchlower.check(d)
    assert res.outputs[0].shape == (2, 3)
    np.testing.assert_allclose(res.outputs[0], res.inputs[0] + W_ROW, rtol=1e-6)
    x = np.ones((5, 3), np.float32)
    assert torchlower.check(d, inputs=[x], expected=[x + W_ROW]).ok
    assert torchlower.check(d, symbol_sizes={"B": 7}).outputs[0].shape == (7, 3)


def test_tract_written_artifact_loads(exported, tmp_path):
    """tract writes a fragment, literal constants and aliases; the parser accepts them."""
    import tract

    out = tmp_path / "by_tract"
    nnef = tract.nnef()
    nnef.write_model_to_dir(nnef.load(str(exported[2])), str(out))
    art = torchlower.load(out)
    assert art.graph.fragments == ["tract_core_properties"]
    assert {"literal", "alias", "matmul"} <= set(art.graph.op_histogram())
    model, x = exported[0], exported[1]
    assert torchlower.check(out, inputs=[x], model=model).ok


def test_system_tar_with_dot_slash_and_folders(tmp_path):
    d = symbolic_dir(tmp_path)
    archive = tmp_path / "sys.nnef.tgz"
    subprocess.run(["tar", "-C", str(d), "-czf", str(archive), "."], check=True)
    with tarfile.open(archive) as tar:
        assert any(n.startswith("./") for n in tar.getnames())
    assert set(torchlower.load(archive).weights) == {"weights/w"}


def test_parser_values():
    g = parse(
        'version 1.0;\nextension tract_symbol S;\ngraph g(i"in put") -> (o)\n{\n'
        '  i"in put" = external<scalar>(shape = [S * 2 + 1, 3]);\n'
        '  o = pad(i"in put", padding = [(0, -1), (1, 2)], border = "constant", value = -1.5e-3);\n}\n'
    )
    assert g.inputs[0].name == "in put" and g.inputs[0].dtype == "scalar"
    assert str(g.inputs[0].shape[0]) == "((S * 2) + 1)" and isinstance(g.inputs[0].shape[0], Expr)
    attrs = g.assignments[1].attrs
    assert (
        attrs["padding"] == [(0, -1), (1, 2)] and attrs["value"] == -1.5e-3 and attrs["border"] == "constant"
    )
    assert g.assignments[1].args == [Ident("in put")]


def test_lattice_folder_goes_to_the_lattice_reader(tmp_path):
    import importlib.util

    d = tmp_path / "lat"
    d.mkdir()
    (d / "graph.mlir").write_text("module {}")
    (d / "weights.safetensors").write_bytes(b"")
    if importlib.util.find_spec("torchlower.lattice") and importlib.util.find_spec("torchlower.lattice.io"):
        pytest.skip("the lattice reader exists; its own tests cover it")
    with pytest.raises(ArtifactError, match="lattice"):
        torchlower.inspect(d)


def test_reading_does_not_import_torch(exported):
    code = (
        "import sys, torchlower; torchlower.inspect(sys.argv[1]); torchlower.check(sys.argv[1]);"
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code, str(exported[2])], check=True, cwd=Path(__file__).parents[1])

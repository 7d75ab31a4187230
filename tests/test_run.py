"""Using an artifact: ``torchlower.load(path).run(...)``, ``torchlower run`` and ``inspect``'s shapes."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import torchlower
import torchlower.artifact.io
from tests.cli_models import TwoHeads
from tests.conftest import aborting_graph
from tests.test_cli import cli, cli_json, stderr_on_a_terminal
from torchlower.errors import CheckError, InvalidArgumentError


@pytest.fixture(scope="module")
def dynamic(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    """Two inputs, two outputs, batch dimension ``B`` shared by both inputs."""
    model = TwoHeads().eval()
    path = tmp_path_factory.mktemp("run") / "two.nnef.tgz"
    torchlower.export(
        model,
        (torch.randn(2, 6), torch.randn(2, 5)),
        path,
        input_names=["x", "y"],
        output_names=["a", "b"],
        dynamic_axes={"x": {0: "B"}, "y": {0: "B"}},
    )
    return path, model


def _expected(model: torch.nn.Module, x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    with torch.no_grad():
        return [t.numpy() for t in model(torch.from_numpy(x), torch.from_numpy(y))]


def test_run_by_name_and_position_at_several_sizes(dynamic: tuple[Path, Any]) -> None:
    path, model = dynamic
    rng = np.random.default_rng(7)
    with torchlower.load(path) as art:
        for batch in (1, 3, 8):
            x = rng.standard_normal((batch, 6)).astype(np.float32)
            y = rng.standard_normal((batch, 5)).astype(np.float32)
            by_name = art.run({"y": y, "x": x})
            by_position = art.run([torch.from_numpy(x), y])
            want = _expected(model, x, y)
            assert list(by_name) == ["a", "b"]
            for name, w in zip(("a", "b"), want, strict=True):
                assert by_name[name].shape == w.shape == (batch, w.shape[1])
                assert np.abs(by_name[name] - w).max() < 1e-5
                # the same plan on the same inputs in the same process: bit for bit by construction
                assert np.array_equal(by_name[name], by_position[name])
        child = art._session.proc.pid
        art.run({"x": x, "y": y})
        assert art._session.proc.pid == child, "the optimized model is reused across calls"


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        (
            {"x": np.zeros((2, 6), np.float64), "y": np.zeros((2, 5), np.float32)},
            "declared float32 but got float64",
        ),
        ({"x": np.zeros((2, 6), np.float32)}, r"missing \['y'\]"),
        ([np.zeros((2, 6), np.float32), np.zeros((3, 5), np.float32)], "symbol B is already 2"),
        (
            [np.zeros((2, 7), np.float32), np.zeros((2, 5), np.float32)],
            "axis 1 has size 7, the graph declares 6",
        ),
        ([np.zeros((2, 6, 1), np.float32), np.zeros((2, 5), np.float32)], "rank 3"),
        ([np.zeros((2, 6), np.float32)], "1 inputs given, the graph takes 2"),
    ],
)
def test_run_checks_inputs_against_the_declaration(
    dynamic: tuple[Path, Any], inputs: Any, message: str
) -> None:
    art = torchlower.load(dynamic[0])
    with pytest.raises(InvalidArgumentError, match=message):
        art.run(inputs)
    assert art._session is None, "nothing reaches tract before the inputs are checked"


def test_threads_go_to_the_child_process(dynamic: tuple[Path, Any]) -> None:
    path, model = dynamic
    x, y = np.ones((2, 6), np.float32), np.ones((2, 5), np.float32)
    with torchlower.load(path) as art:
        one = art.run([x, y], threads=1)
        environ = Path(f"/proc/{art._session.proc.pid}/environ")
        if environ.exists():
            assert b"RAYON_NUM_THREADS=1\0" in environ.read_bytes()
        two = art.run([x, y], threads=2)
        if environ.exists():
            assert b"RAYON_NUM_THREADS=2\0" in Path(f"/proc/{art._session.proc.pid}/environ").read_bytes()
        # both right, not necessarily the same bits: how tract splits its products across
        # threads is tract's choice (1e-5 as in test_run_by_name_and_position_at_several_sizes)
        want = dict(zip(("a", "b"), _expected(model, x, y), strict=True))
        assert all(np.abs(got[k] - want[k]).max() < 1e-5 for got in (one, two) for k in want)
    with pytest.raises(InvalidArgumentError, match="positive integer"):
        torchlower.load(path).run([x, y], threads=0)


def test_in_process_run_matches(dynamic: tuple[Path, Any]) -> None:
    path, model = dynamic
    x = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    y = np.random.default_rng(2).standard_normal((4, 5)).astype(np.float32)
    with torchlower.load(path) as art:
        out = art.run([x, y], isolated=False)
    assert np.abs(out["a"] - _expected(model, x, y)[0]).max() < 1e-5


def test_tract_abort_during_run_is_a_check_error(tmp_path: Path) -> None:
    """tract panics (SIGABRT) on an einsum with '...'; the caller's process survives."""
    bad = aborting_graph(tmp_path)
    with pytest.raises(CheckError, match="tract"):
        torchlower.load(bad).run([np.ones((2, 3, 3), np.float32)])


def test_cli_run_prints_saves_and_times(dynamic: tuple[Path, Any], tmp_path: Path) -> None:
    path, model = dynamic
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((5, 6)).astype(np.float32), rng.standard_normal((5, 5)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x, y=y)
    data = cli_json("run", path, "--inputs", tmp_path / "in.npz", "--out", tmp_path / "out.npz", "--time", 3)
    assert [o["name"] for o in data["outputs"]] == ["a", "b"]
    assert data["outputs"][0]["shape"] == [5, 3] and data["outputs"][0]["dtype"] == "float32"
    want = _expected(model, x, y)
    assert abs(data["outputs"][1]["mean"] - float(want[1].mean())) < 1e-5
    assert data["latency_ms"]["runs"] == 3 and data["latency_ms"]["median"] > 0
    with np.load(tmp_path / "out.npz") as saved:
        assert np.abs(saved["a"] - want[0]).max() < 1e-5 and np.abs(saved["b"] - want[1]).max() < 1e-5
    text = cli("run", path, "--inputs", tmp_path / "in.npz")
    assert text.returncode == 0 and "out a" in text.stdout and "5×3" in text.stdout, text.stdout
    assert text.stderr == "", "no progress noise when piped"


def test_cli_run_random_inputs_and_bad_dtype(dynamic: tuple[Path, Any], tmp_path: Path) -> None:
    path, _ = dynamic
    data = cli_json("run", path, "--symbol", "B=3")
    assert data["random_inputs"] and data["inputs"][0]["shape"] == [3, 6]
    np.savez(tmp_path / "bad.npz", x=np.zeros((2, 6), np.int64), y=np.zeros((2, 5), np.float32))
    proc = cli("run", path, "--inputs", tmp_path / "bad.npz")
    assert proc.returncode == 2 and "declared float32 but got int64" in proc.stderr, proc.stderr


def test_inspect_shows_symbolic_output_shapes(dynamic: tuple[Path, Any]) -> None:
    path, _ = dynamic
    data = cli_json("inspect", path)
    assert data["outputs"] == [
        {"name": "a", "shape": ["B", 3], "dtype": "float32"},
        {"name": "b", "shape": ["B", 2], "dtype": "float32"},
    ]
    assert data["inputs"][0] == {"name": "x", "shape": ["B", 6], "dtype": "float32"}
    table = cli("inspect", path)
    assert "output a" in table.stdout and "['B', 3] float32" in table.stdout, table.stdout
    quick = cli_json("inspect", path, "--no-shapes")
    assert quick["outputs"][0] == {"name": "a", "shape": None, "dtype": None}


def test_inspect_graph_prints_the_text(dynamic: tuple[Path, Any]) -> None:
    path, _ = dynamic
    proc = cli("inspect", path, "--graph")
    assert proc.returncode == 0 and proc.stdout.startswith("version 1.0;")
    assert "graph network(x, y) -> (a, b)" in proc.stdout
    assert "# module: a" in proc.stdout, "the module of each op is recorded as a comment"
    assert torchlower.artifact.io.graph_text(path) == proc.stdout


def test_progress_is_silent_when_piped(dynamic: tuple[Path, Any]) -> None:
    proc = cli("inspect", dynamic[0], TORCHLOWER_PROGRESS_DELAY="0")
    assert proc.returncode == 0 and proc.stderr == ""
    assert os.environ.get("TORCHLOWER_PROGRESS") != "0"


def test_progress_of_run_and_picture_on_a_terminal(dynamic: tuple[Path, Any], tmp_path: Path) -> None:
    ran = stderr_on_a_terminal("run", dynamic[0], "--symbol", "B=2")
    # a stage is drawn once the display is up (a timer thread): the long ones always are
    assert "tract load+optimize" in ran and "running" in ran
    drawn = stderr_on_a_terminal("inspect", dynamic[0], "--svg", tmp_path / "p.svg")
    assert "tract shapes" in drawn and "drawing" in drawn
    quiet = cli("run", dynamic[0], "--quiet")
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""


LATTICE = Path("/work/shared/fixtures/lattice")


def _dense_inputs(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "points": rng.uniform(-0.9, 0.9, (n, 3)).astype(np.float32),
        "feats": rng.standard_normal((n, 4)).astype(np.float32),
        "batch_indices": np.zeros(n, np.int32),
        "active_rows": np.array([n], np.int32),
    }


@pytest.mark.skipif(not (LATTICE / "dense").is_dir(), reason="shared lattice fixtures not present")
def test_lattice_folder_runs_in_the_reference_executor(tmp_path: Path) -> None:
    from torchlower.lattice import api

    inputs = _dense_inputs(40, 0)
    with torchlower.load(LATTICE / "dense") as art:
        out = art.run(inputs)
        with pytest.raises(InvalidArgumentError, match="declared float32 but got float64"):
            art.run({**inputs, "feats": inputs["feats"].astype(np.float64)})
    assert list(out) == [
        "point_feats", "pooled.coords", "pooled.features", "gated.coords", "gated.features",
    ]  # fmt: skip
    direct = api.run(api.load(LATTICE / "dense"), [torch.from_numpy(v) for v in inputs.values()])
    # the same executor on the same inputs in this process, at the same thread count: bit for bit
    assert np.array_equal(out["point_feats"], direct[0].numpy())
    assert np.array_equal(out["pooled.coords"], direct[1].coords.numpy())
    np.savez(tmp_path / "in.npz", **inputs)
    data = cli_json("run", LATTICE / "dense", "--inputs", tmp_path / "in.npz")
    assert data["engine"] == "the reference executor"
    assert data["outputs"][0] == {"name": "point_feats", **runner_stats(out["point_feats"])}
    proc = cli("run", LATTICE / "dense")
    assert proc.returncode == 2 and "--inputs" in proc.stderr


def runner_stats(array: np.ndarray) -> dict[str, Any]:
    from torchlower.artifact import runner

    return runner.statistics(array)


def test_one_dtype_vocabulary(tmp_path: Path) -> None:
    from torchlower.cli import specs
    from torchlower.core import dtypes

    for text in ("ids:1x4:i64", "ids:1x4:long", "ids:1x4:int64", "ids:1x4:torch.int64"):
        assert specs.input_spec(text).dtype == "int64"
    assert {dtypes.name(d) for d in ("f32", "scalar", "float", np.dtype(np.float32), "torch.float32")} == {
        "float32"
    }
    for spelling in ("f32", "float32"):
        data = cli_json(
            "export", "tests.cli_models:mlp", "-o", tmp_path / f"{spelling}.nnef.tgz", "--input",
            f"x:2x8:{spelling}",
        )  # fmt: skip
        assert data["inputs"][0]["dtype"] == "float32"
    proc = cli("export", "tests.cli_models:mlp", "-o", tmp_path / "q.nnef.tgz", "--input", "x:2x8:q8")
    assert proc.returncode == 2 and "unknown dtype 'q8'" in proc.stderr and "int64" in proc.stderr


def test_artifacts_honour_the_umask_and_dir_lists_the_api(tmp_path: Path) -> None:
    old = os.umask(0o027)
    try:
        model = torch.nn.Linear(3, 2).eval()
        for name in ("m.nnef.tgz", "m.nnef"):
            path = torchlower.export(model, torch.randn(1, 3), tmp_path / name, check=False).path
            mode = path.stat().st_mode & 0o777
            assert mode == (0o750 if path.is_dir() else 0o640), oct(mode)
    finally:
        os.umask(old)
    public = [n for n in dir(torchlower) if not n.startswith("_")]
    assert public == sorted(torchlower.__all__) and "load" in public and "Any" not in public


def test_ops_grep() -> None:
    data = cli_json("ops", "--grep", "^aten::conv")
    assert data["count"] == len(data["ops"]) > 0
    assert all(r["op"].lower().startswith("aten::conv") for r in data["ops"])
    assert cli_json("ops", "--grep", "no-such-op-anywhere")["count"] == 0
    bad = cli("ops", "--grep", "(")
    assert bad.returncode == 2 and "not a regular expression" in bad.stderr


def test_check_without_symbol_uses_the_sizes_of_the_export(dynamic: tuple[Path, Any], tmp_path: Path) -> None:
    """The fixture was exported at B=2: `check` draws its random inputs at B=2 unless told."""
    assert torchlower.load(dynamic[0]).graph.example_sizes == {"B": 2}
    data = cli_json("check", dynamic[0])
    assert [i["shape"] for i in data["inputs"]] == [[2, 6], [2, 5]]
    other = cli_json("check", dynamic[0], "--symbol", "B=5")
    assert [i["shape"] for i in other["inputs"]] == [[5, 6], [5, 5]]


def test_training_mode_warning_once_per_export(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(0)
    inner = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.1), torch.nn.BatchNorm1d(4))
    model = torch.nn.Sequential(inner, torch.nn.Sequential(torch.nn.Linear(4, 2), torch.nn.Dropout(0.2)))
    assert model.training
    with caplog.at_level("WARNING", logger="torchlower"):
        torchlower.export(model, torch.randn(3, 4), tmp_path / "t.nnef.tgz", dynamic_axes={"input": {0: "B"}})
    warned = [r for r in caplog.records if "training mode" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in warned]
    assert model.training and all(m.training for m in model.modules()), "the caller's model is untouched"


def test_wire_format_keeps_dtype_shape_and_values() -> None:
    import io as _io

    from torchlower.nnef.session import receive, send

    arrays = [
        np.array([True, False]),
        np.arange(6, dtype=np.float16).reshape(2, 3),
        np.arange(5, dtype=np.int64)[::2],  # not contiguous
        np.zeros((0, 4), np.float32),  # empty
        np.float32(3.0).reshape(()),  # rank 0
        np.asfortranarray(np.arange(6.0).reshape(2, 3)),
    ]
    buffer = _io.BytesIO()
    send(buffer, {"error": None}, arrays)
    buffer.seek(0)
    header, back = receive(buffer)
    assert header == {"error": None}
    for a, b in zip(arrays, back, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)


def test_run_rank0_input_and_bool_output(tmp_path: Path) -> None:
    folder = tmp_path / "cmp.nnef"
    folder.mkdir()
    (folder / "graph.nnef").write_text(
        "version 1.0;\nextension tract_registry tract_core;\ngraph network(x, t) -> (y)\n{\n"
        "    x = tract_core_external(shape = [3], datum_type = 'f32');\n"
        "    t = tract_core_external(shape = [], datum_type = 'f32');\n"
        "    y = gt(x, t);\n}\n"
    )
    out = torchlower.load(folder).run([np.array([-1.0, 0.5, 2.0], np.float32), np.float32(0.7).reshape(())])
    assert out["y"].dtype == np.bool_ and out["y"].tolist() == [False, False, True]

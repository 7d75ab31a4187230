"""The real command line in a subprocess: export → check → inspect, pictures, errors and exit codes."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import struct
import subprocess
import sys
import tarfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).with_name("torchlower")
MLP = "tests.cli_models:mlp"


def command() -> list[str]:
    """The installed console script when there is one, else ``python -m torchlower``."""
    return [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "torchlower"]


def env(**extra: str) -> dict[str, str]:
    site = ROOT / "tests" / "subprocess_site"  # torchvision's CUDA-wheel bypass, as in conftest
    path = os.pathsep.join([str(site), str(ROOT), os.environ.get("PYTHONPATH", "")])
    base = dict(os.environ, PYTHONPATH=path)
    return {**base, **extra}


def cli(*args: Any, stderr: Any = subprocess.PIPE, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command(), *map(str, args)],
        cwd=ROOT,
        env=env(**extra),
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )


def cli_json(*args: Any, code: int = 0) -> dict[str, Any]:
    proc = cli(*args, "--json")
    assert proc.returncode == code, proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    path = tmp_path_factory.mktemp("cli") / "mlp.nnef.tgz"
    return path, cli_json("export", MLP, "-o", path, "--input", "x:2x8")


def test_export_json_report(exported: tuple[Path, dict[str, Any]]) -> None:
    path, data = exported
    assert path.is_file() and data["ok"] and data["checked"]
    assert data["inputs"] == [{"name": "x", "shape": [2, 8], "dtype": "float32"}]
    assert data["outputs"][0]["shape"] == [2, 4]
    assert data["ops"]["matmul"] == 2 and data["ops"]["relu"] == 1
    assert data["weight_bytes"] == (8 * 16 + 16 + 16 * 4 + 4) * 4
    assert data["max_abs_error"] < 1e-5


def test_check_against_model_and_expected(exported: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, _ = exported
    x = np.random.default_rng(3).standard_normal((2, 8)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    data = cli_json("check", path, "--inputs", tmp_path / "in.npz", "--model", MLP)
    assert data["reference"] == "model" and not data["random_inputs"]
    assert data["compared"][0]["ok"] and data["max_abs_error"] < 1e-5
    from tests.cli_models import mlp

    expected = mlp()(torch.from_numpy(x)).detach().numpy()
    np.savez(tmp_path / "good.npz", output=expected)
    np.savez(tmp_path / "bad.npz", output=expected + 0.5)
    good = cli_json("check", path, "--inputs", tmp_path / "in.npz", "--expected", tmp_path / "good.npz")
    assert good["compared"][0]["max_abs"] < 1e-5
    bad = cli_json("check", path, "--inputs", tmp_path / "in.npz", "--expected", tmp_path / "bad.npz", code=1)
    assert bad["error"]["type"] == "CheckError" and not bad["outputs"][0]["ok"]
    assert abs(bad["outputs"][0]["max_abs"] - 0.5) < 1e-4


def test_mismatch_text_names_the_output(exported: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    path, _ = exported
    np.savez(tmp_path / "wrong.npz", np.ones((2, 4), np.float32))
    proc = cli("check", path, "--expected", tmp_path / "wrong.npz")
    assert proc.returncode == 1
    assert "output: max abs" in proc.stderr and "MISMATCH" in proc.stderr and "hint:" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_inspect_json(exported: tuple[Path, dict[str, Any]]) -> None:
    path, _ = exported
    data = cli_json("inspect", path)
    assert data["format"] == "nnef" and data["container"] == "tgz"
    assert data["inputs"] == [{"name": "x", "shape": [2, 8], "dtype": "float32"}]
    assert data["weights"]["bytes_by_dtype"] == {"float32": 848}
    assert data["op_count"] == sum(data["ops"].values())


def test_picture_svg_png_one_node_per_op(exported: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    if shutil.which("dot") is None:
        pytest.skip("Graphviz `dot` is not installed (make setup installs it)")
    path, _ = exported
    svg = cli_json("inspect", path, "--svg", tmp_path / "g.svg", "--detail", "ops")
    text = (tmp_path / "g.svg").read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text and text.rstrip().endswith("</svg>")
    assert text.count('class="node"') == svg["op_count"] == svg["picture"]["nodes"]
    titles = re.findall(r'<g id="node\d+" class="node">\s*<title>(n\d+)</title>', text)
    assert sorted(titles) == sorted(f"n{i}" for i in range(svg["op_count"]))
    assert re.search(r">2×16<", text), "an intermediate edge is labelled with its shape"
    for op in svg["ops"]:
        if op not in ("variable", "tract_core_external"):
            assert f">{op}<" in text
    png = cli_json("inspect", path, "--png", tmp_path / "g.png", "--detail", "ops")
    blob = (tmp_path / "g.png").read_bytes()
    assert blob[:8] == b"\x89PNG\r\n\x1a\n" and blob[12:16] == b"IHDR"
    width, height = struct.unpack(">II", blob[16:24])
    assert width > 100 and height > 100
    assert zlib.crc32(blob[12:29]) == struct.unpack(">I", blob[29:33])[0]
    assert png["picture"]["nodes"] == png["op_count"]


def test_two_inputs_two_outputs_directory_no_check(tmp_path: Path) -> None:
    out = tmp_path / "heads.nnef"
    proc = cli(
        "export", "tests.cli_models:TwoHeads", "-o", out, "--input", "x:3x6", "--input", "y:3x5",
        "--output-name", "a", "--output-name", "b", "--no-check", "--frontend", "jit",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "not checked" in proc.stdout and (out / "graph.nnef").is_file()
    data = cli_json("check", out, "--model", "tests.cli_models:TwoHeads", "--symbol", "B=3")
    assert [o["name"] for o in data["outputs"]] == ["a", "b"]
    assert [o["shape"] for o in data["outputs"]] == [[3, 3], [3, 2]]
    assert all(e["ok"] for e in data["compared"])


def test_weights_are_loaded_and_checked(tmp_path: Path) -> None:
    from tests.cli_models import mlp

    model = mlp()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-2.0)
    torch.save(model.state_dict(), tmp_path / "w.pt")
    out = tmp_path / "w.nnef.tgz"
    data = cli_json(
        "export", MLP, "-o", out, "--input", "x:2x8", "--weights", tmp_path / "w.pt", "--frontend", "jit"
    )
    assert data["max_abs_error"] < 1e-5
    ok = cli_json("check", out, "--model", MLP, "--weights", tmp_path / "w.pt")
    assert ok["compared"][0]["ok"]
    wrong = cli_json("check", out, "--model", MLP, code=1)  # the factory's own weights differ
    assert not wrong["outputs"][0]["ok"]


def test_pickled_object_needs_trust(tmp_path: Path) -> None:
    from tests.cli_models import mlp

    torch.save(mlp(), tmp_path / "whole.pt")  # a pickled module, not a state dict
    args = [
        "export",
        MLP,
        "-o",
        tmp_path / "m.nnef.tgz",
        "--input",
        "x:2x8",
        "--weights",
        tmp_path / "whole.pt",
    ]
    refused = cli(*args)
    assert refused.returncode == 2 and "--trust" in refused.stderr
    assert cli(*args, "--trust", "--no-check", "--frontend", "jit").returncode == 0


@pytest.mark.parametrize(
    ("args", "culprit"),
    [
        (["--input", "x:2xq8"], "x:2xq8"),
        (["--input", "x:2x8:f99"], "f99"),
        (["--input", "x:2x9"], "x [2, 9]"),
        ([], "--input"),
    ],
)
def test_bad_input_is_exit_2(tmp_path: Path, args: list[str], culprit: str) -> None:
    proc = cli("export", MLP, "-o", tmp_path / "m.nnef.tgz", *args)
    assert proc.returncode == 2
    assert culprit in proc.stderr and "hint:" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "m.nnef.tgz").exists()


def test_bad_usage_json_and_debug(tmp_path: Path) -> None:
    data = cli_json("export", "no_such_module:f", "-o", tmp_path / "m.nnef.tgz", "--input", "x:1", code=2)
    assert data["error"]["type"] == "InvalidArgumentError" and "no_such_module" in data["error"]["message"]
    debug = cli("check", tmp_path / "missing.nnef.tgz", "--debug")
    assert debug.returncode == 2 and "Traceback" in debug.stderr
    assert cli("frobnicate").returncode == 2
    assert cli().returncode == 2


def test_unsupported_op_is_exit_3(tmp_path: Path) -> None:
    data = cli_json(
        "export",
        "tests.cli_models:Determinant",
        "-o",
        tmp_path / "d.nnef.tgz",
        "--input",
        "x:2x3x3",
        "--frontend",
        "jit",
        code=3,
    )
    assert [o["op"] for o in data["unsupported_ops"]] == ["aten::linalg_det"]
    assert "torchlower ops" in data["error"]["hint"]


@pytest.mark.parametrize(
    ("option", "keyword"), [("--dynamic=x:0=B", "dynamic_axes"), ("--compress=q4_0", "compress")]
)
def test_planned_options_refused_cleanly(tmp_path: Path, option: str, keyword: str) -> None:
    import inspect

    import torchlower

    if keyword in inspect.signature(torchlower.export).parameters:
        pytest.skip(f"export() takes {keyword}= now; its tests cover it")
    proc = cli("export", MLP, "-o", tmp_path / "m.nnef.tgz", "--input", "x:2x8", option)
    assert proc.returncode == 2 and "not supported yet" in proc.stderr


def test_ops_table() -> None:
    from torchlower.pipeline.export import FRONTENDS
    from torchlower.rules import coverage

    data = cli_json("ops")
    assert data["ops"] == coverage.support_rows()  # only rules with a recorded runtime proof
    for row in data["ops"]:
        assert row["test"].startswith("tests/") and row["frontends"]
        if row["kind"] == "op":
            assert row["frontends"] == list(FRONTENDS)
    md = cli("ops", "--markdown").stdout
    assert md == coverage.markdown()


def stderr_on_a_terminal(*args: Any) -> str:
    """What a command draws on a terminal's stderr (a pty), with progress shown at once."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [*command(), *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE, stderr=slave,
        env=env(TORCHLOWER_PROGRESS_DELAY="0"),
    )  # fmt: skip
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 60)
        try:
            chunk = os.read(master, 65536) if ready else b""
        except OSError:
            chunk = b""
        if not chunk:
            break
        seen += chunk
    os.close(master)
    assert proc.wait(60) == 0
    return seen.decode("utf-8", "replace")


def test_progress_on_a_terminal_only(tmp_path: Path) -> None:
    """A pty as stderr shows stage names; piped stderr (every other test) has none."""
    args = ["export", MLP, "-o", tmp_path / "p.nnef.tgz", "--input", "x:2x8"]
    text = stderr_on_a_terminal(*args)
    assert "lowering" in text or "tracing" in text
    quiet = cli(*args, "--quiet", "--no-check")
    assert quiet.returncode == 0 and quiet.stdout == "" and "tracing" not in quiet.stderr


def test_a_picture_into_a_missing_folder_is_a_clear_error(
    exported: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    for renderer_path in (os.environ["PATH"], str(tmp_path)):  # Graphviz, and the Python layout
        proc = cli("inspect", exported[0], "--png", tmp_path / "no" / "g.png", PATH=renderer_path)
        assert proc.returncode == 2 and "does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_python_m_and_demo(tmp_path: Path) -> None:
    version = subprocess.run(
        [sys.executable, "-m", "torchlower", "--version"], cwd=ROOT, env=env(), capture_output=True, text=True
    )
    assert version.returncode == 0 and version.stdout.startswith("torchlower ")
    demo = cli("demo", "-o", tmp_path / "demo.nnef.tgz")
    assert demo.returncode in (0, 3), demo.stderr
    if demo.returncode == 0:  # needs the conv / batch-norm / pooling rules
        assert "verified" in demo.stdout and (tmp_path / "demo.nnef.tgz").is_file()
    else:
        assert "unsupported op" in demo.stderr


def test_export_whose_check_fails_leaves_no_file(tmp_path: Path) -> None:
    """Exit 1 on the mismatch, and no archive (nor staging file) where -o pointed."""
    target = tmp_path / "m.nnef.tgz"
    data = cli_json("export", "tests.cli_models:Drifting", "-o", target, "--input", "x:2x3", code=1)
    assert data["error"]["type"] == "CheckError" and str(target) in data["error"]["message"]
    assert list(tmp_path.iterdir()) == []


def test_dynamic_axis_with_bounds(tmp_path: Path) -> None:
    """``--dynamic x:0=B[2..16]``: the bounds become tract assertions, the check runs inside
    them, and the archive matches PyTorch in tract at sizes across the range."""
    import torchlower
    from tests.cli_models import mlp

    path = tmp_path / "m.nnef.tgz"
    data = cli_json("export", MLP, "-o", path, "--input", "x:3x8", "--dynamic", "x:0=B[2..16]")
    assert data["ok"] and {"B=2", "B=7"} <= {p["label"] for p in data["points"]}
    assert all(2 <= p["inputs"][0][0] <= 16 for p in data["points"])
    assert data["inputs"][0]["shape"] == ["B", 8]
    with tarfile.open(path) as tar:
        text = tar.extractfile("graph.nnef").read().decode()  # type: ignore[union-attr]
    assert "extension tract_assert B >= 2;" in text and "extension tract_assert B <= 16;" in text
    model = mlp()
    with torchlower.load(path) as art:
        for b in (2, 9, 16):
            x = torch.randn(b, 8, generator=torch.Generator().manual_seed(b))
            got = art.run({"x": x.numpy()})["output"]
            assert np.abs(got - model(x).detach().numpy()).max() < 1e-5, b


@pytest.mark.parametrize(
    ("spec", "culprit"),
    [("x:0=B[5..2]", "1 <= MIN <= MAX"), ("x:0=B[0..4]", "1 <= MIN <= MAX"),
     ("x:0=B[a..4]", "SYMBOL[MIN..MAX]"), ("x:0=B[2-4]", "SYMBOL[MIN..MAX]"),
     ("x:0=B[4..16]", "outside its bounds 4..16")],
)  # fmt: skip
def test_dynamic_bounds_malformed_is_exit_2(tmp_path: Path, spec: str, culprit: str) -> None:
    out = tmp_path / "m.nnef.tgz"
    data = cli_json("export", MLP, "-o", out, "--input", "x:3x8", "--dynamic", spec, code=2)
    assert data["error"]["type"] == "InvalidArgumentError" and culprit in data["error"]["message"], data
    assert list(tmp_path.iterdir()) == []

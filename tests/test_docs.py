"""Documentation examples run, so they cannot rot.

A fenced block whose info string is ``python runnable`` is executed; the blocks of one file share
a namespace and run in order, in a fresh folder. ``python runnable needs=aten::conv2d,...``
runs once those rules are registered; until then it and the blocks after it are skipped, naming
what is missing.
A ``console runnable`` block holds ``$ torchlower ...`` lines that must exit 0.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
FENCE = re.compile(r"^```(python|console) runnable([^\n]*)\n(.*?)^```", re.M | re.S)


def blocks(doc: Path) -> list[tuple[str, list[str], str, int]]:
    text = doc.read_text()
    found = []
    for m in FENCE.finditer(text):
        needs = re.search(r"needs=(\S+)", m.group(2))
        found.append(
            (
                m.group(1),
                needs.group(1).split(",") if needs else [],
                m.group(3),
                text[: m.start()].count("\n") + 1,
            )
        )
    return found


def missing_rules(keys: list[str]) -> list[str]:
    from torchlower.rules import NNEF_RULES

    return [k for k in keys if NNEF_RULES.lookup_function(k) is None]


DOCS_WITH_EXAMPLES = [d for d in DOCS if blocks(d)]


def test_docs_have_examples() -> None:
    names = {d.name for d in DOCS_WITH_EXAMPLES}
    assert {"README.md", "getting-started.md", "frontends.md", "troubleshooting.md"} <= names


@pytest.mark.parametrize("doc", DOCS_WITH_EXAMPLES, ids=lambda d: d.name)
def test_examples_run(doc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    namespace: dict[str, object] = {"__name__": f"doc_{doc.stem.replace('-', '_')}"}
    skipped = []
    for kind, needs, code, line in blocks(doc):
        absent = missing_rules(needs)
        if absent:  # later blocks may build on this one: stop here
            skipped.append(f"line {line} needs {', '.join(absent)}")
            break
        if kind == "python":
            exec(compile(code, f"{doc.name}:{line}", "exec"), namespace)  # our own docs
        else:
            run_console(code, doc, line, tmp_path)
    if skipped:
        pytest.skip(f"{doc.name}: examples waiting for rules: {'; '.join(skipped)}")


def run_console(code: str, doc: Path, line: int, cwd: Path) -> None:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(cwd), os.environ.get("PYTHONPATH", "")])
    )
    for command in [c[2:] for c in code.splitlines() if c.startswith("$ ")]:
        argv = shlex.split(command)
        assert argv[0] == "torchlower", f"{doc.name}:{line}: only torchlower commands run: {command}"
        proc = subprocess.run(
            [sys.executable, "-m", "torchlower", *argv[1:]], cwd=cwd, env=env, capture_output=True, text=True
        )
        assert proc.returncode == 0, f"{doc.name}:{line}: `{command}` exited {proc.returncode}\n{proc.stderr}"

"""docs/operators.md is generated from the registry and the proof record: it must be current."""

from __future__ import annotations

from pathlib import Path

from torchlower.rules import coverage


def test_operators_doc_is_current():
    doc = Path(__file__).resolve().parents[1] / "docs" / "operators.md"
    assert doc.read_text() == coverage.markdown(), "docs/operators.md is stale: run `make ops-doc`"


def test_every_listed_op_names_an_existing_test():
    root = Path(__file__).resolve().parents[1]
    for row in coverage.support_rows():
        path = root / row["test"].split("::")[0]
        assert path.exists(), row

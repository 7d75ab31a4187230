"""``nnef/concretize.py``: symbols written into the graph text only where tract computes the same.

A literal ``-3 / 4`` truncates in tract while its symbolic division floors, so a graph whose
division goes negative at the run's size keeps tract's ``SetSymbols`` instead; the run must give
the generic plan's numbers either way (checked in real tract).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import torchlower
from torchlower.nnef.concretize import concretize

GRAPH = """version 1.0;

extension tract_registry tract_core;
extension tract_symbol S;
extension tract_assert S >= 1;

graph network(x) -> (y)
{{
    x = tract_core_external(shape = [1, S], datum_type = 'f32');
    w = variable<scalar>(label = 'S.weight', shape = [1]);
    y = slice(x, axes = [1], begin = [0], end = [{end}]);
}}
"""


def test_symbols_become_literals_outside_strings_and_names() -> None:
    text = concretize(GRAPH.format(end="(S - 1) / 2 + 1"), {"S": 7})
    assert text is not None
    assert "tract_symbol" not in text and "tract_assert" not in text
    assert "shape = [1, 7]" in text and "end = [(7 - 1) / 2 + 1]" in text
    assert "label = 'S.weight'" in text, "a string is not a symbol"


def test_refused_where_literal_arithmetic_differs() -> None:
    negative = GRAPH.format(end="(S - 9) / 4 + 3")
    assert concretize(negative, {"S": 9}) is not None
    assert concretize(negative, {"S": 6}) is None, "-3 / 4: literal 0, symbolic -1"
    unchecked = GRAPH.format(end="S").replace("S >= 1", "2 * S <= 64")
    assert concretize(unchecked, {"S": 6}) is None, "an assertion the runner does not check"


def test_fallback_runs_like_the_generic_plan(tmp_path: Path) -> None:
    folder = tmp_path / "neg.nnef"
    folder.mkdir()
    text = GRAPH.format(end="(S - 9) / 4 + 3").replace("    w = v", "    # w = v")  # no weight file
    (folder / "graph.nnef").write_text(text)
    x = np.arange(6, dtype=np.float32)[None]
    with torchlower.load(folder) as art:
        generic = art.run(x)["y"]
        sized = art.run(x, specialize=True)["y"]
        assert art._session.plans["S=6"]["inputs"] == ["1,6,f32"]
    assert generic.shape == (1, 2), "floor((6 - 9) / 4) + 3"
    np.testing.assert_array_equal(sized, generic)

"""Shared fixtures: every rule test runs through each front end and the real tract runtime."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

import torchlower
from tests import torchvision_shim
from torchlower.pipeline.export import FRONTENDS, ExportReport

torchvision_shim.install()  # before anything (transformers) imports torchvision
torchvision_shim.install_torchaudio()  # transformers' audio_utils imports torchaudio (a CUDA wheel)

pytest_plugins = ["tests.coverage_plugin"]

if os.environ.get("PYTEST_XDIST_WORKER"):
    # ``make test`` runs one worker per core: torch's default of one thread per core in each worker
    # oversubscribes the machine (conv/pool tests ran 1.45x slower on 2 cores with 2 threads each)
    torch.set_num_threads(1)


@pytest.fixture(params=FRONTENDS)
def frontend(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)


def export_and_check(
    model: torch.nn.Module,
    args: torch.Tensor | Sequence[torch.Tensor],
    tmp_path: Path,
    frontend: str = "jit",
    tolerance: float | None = None,
    allow_value_dependent_trace: bool = False,
) -> ExportReport:
    """Export, run in tract, and assert that every output matches PyTorch."""
    report = torchlower.export(
        model.eval(), args, tmp_path / "model.nnef.tgz", frontend=frontend, tolerance=tolerance,
        allow_value_dependent_trace=allow_value_dependent_trace,
    )  # fmt: skip
    assert report.errors, "the export was not checked"
    for err in report.errors:
        assert err.ok, f"{err.name}: max |torch - tract| = {err.max_abs}"
    return report


def frontend_limit(
    request: pytest.FixtureRequest, frontend: str, failing: str, raises: type[Exception], reason: str
) -> None:
    """Mark only ``failing``'s run of this case a strict expected failure (a front-end limitation)."""
    if frontend == failing:
        request.applymarker(pytest.mark.xfail(raises=raises, strict=True, reason=reason))


class Fn(torch.nn.Module):
    """Wraps a function as a module, so a rule test is one line (``Fn(torch.sin)``)."""

    def __init__(self, fn: Callable[..., object]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: torch.Tensor) -> object:
        return self.fn(*xs)


def aborting_graph(folder: Path) -> Path:
    """An NNEF folder tract 0.23 panics on (SIGABRT: an einsum with '...'), for crash isolation."""
    bad = folder / "bad.nnef"
    bad.mkdir()
    (bad / "graph.nnef").write_text(
        "version 1.0;\nextension tract_registry tract_core;\ngraph network(x) -> (y)\n{\n"
        "    x = tract_core_external(shape = [2, 3, 3], datum_type = 'f32');\n"
        "    y = tract_core_einsum([x, x], expr = '...ij,...jk->...ik', acc = 'f32', output = '');\n}\n"
    )
    return bad


@pytest.fixture(scope="session")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One checked export per LLM kind for the session (``tests/archive_exports.py``)."""
    from tests.archive_exports import Exports

    return Exports(tmp_path_factory)

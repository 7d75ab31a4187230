"""``run(..., specialize=True)``: a dynamic archive optimized per size, as fast as a static one.

tract 0.23 lowers a convolution over symbolic spatial sizes to im2col + matmul (up to 3x slower
than its direct kernels, bench/results-issue28.md); with the sizes set before optimizing it picks
the static kernels. The numbers must stay torch's at every size, and the sessions kept bounded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import torchlower
from tests.test_cli import cli_json
from torchlower.artifact import runner
from torchlower.errors import InvalidArgumentError


class Stride4(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.b = torch.nn.Conv2d(8, 4, 3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, torch.nn.Module]:
    torch.manual_seed(0)
    model = Stride4().eval()
    path = tmp_path_factory.mktemp("specialize") / "conv.nnef.tgz"
    torchlower.export(
        model, torch.randn(1, 3, 16, 16), path, dynamic_axes={"x": {0: "B", 2: "4*h", 3: "4*w"}}
    )
    return path, model


def test_each_size_gets_its_own_static_plan(archive: tuple[Path, torch.nn.Module]) -> None:
    path, model = archive
    rng = np.random.default_rng(3)
    with torchlower.load(path) as art:
        for shape in ((1, 3, 16, 16), (2, 3, 24, 40), (1, 3, 16, 16)):
            x = rng.standard_normal(shape).astype(np.float32)
            with torch.no_grad():
                want = model(torch.from_numpy(x)).numpy()
            sized = next(iter(art.run(x, specialize=True).values()))
            generic = next(iter(art.run(x).values()))
            assert sized.shape == want.shape
            assert np.abs(sized - want).max() < 1e-5
            assert np.abs(generic - want).max() < 1e-5
        assert len(art._sized) == 2, "a size seen again reuses its session"
        facts = [s.facts["inputs"] for s in art._sized.values()]
        assert facts == [["2,3,24,40,f32"], ["1,3,16,16,f32"]], "tract sees fixed sizes (last used last)"
        assert art._session.facts["inputs"] == ["B,3,4*h,4*w,f32"], "the generic session keeps its symbols"


def test_sessions_kept_are_bounded(archive: tuple[Path, torch.nn.Module]) -> None:
    path, _ = archive
    with torchlower.load(path) as art:
        for h in range(1, runner.SIZED_KEPT + 3):
            art.run(np.zeros((1, 3, 4 * h, 8), np.float32), specialize=True)
        assert len(art._sized) == runner.SIZED_KEPT
        kept = [dict(key[2])["h"] for key in art._sized]
        assert kept == list(range(3, runner.SIZED_KEPT + 3)), "the least recently used go first"


def test_declaration_is_still_enforced(archive: tuple[Path, torch.nn.Module]) -> None:
    path, _ = archive
    with torchlower.load(path) as art, pytest.raises(InvalidArgumentError, match="not a multiple of 4"):
        art.run(np.zeros((1, 3, 17, 16), np.float32), specialize=True)


def test_cli_specialize(archive: tuple[Path, torch.nn.Module], tmp_path: Path) -> None:
    path, model = archive
    x = np.random.default_rng(5).standard_normal((1, 3, 20, 12)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    data = cli_json(
        "run",
        str(path),
        "--inputs",
        str(tmp_path / "in.npz"),
        "--out",
        str(tmp_path / "o.npz"),
        "--specialize",
        "--time",
        "2",
    )
    assert data["ok"] and data["latency_ms"]["runs"] == 2
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    got = next(iter(np.load(tmp_path / "o.npz").values()))
    assert np.abs(got - want).max() < 1e-5

"""``run(..., specialize=True)``: a dynamic archive optimized per size, as fast as a static one.

tract 0.23 lowers a convolution over symbolic spatial sizes to im2col + matmul (up to 3x slower
than its direct kernels, bench/results-issue28.md); with the sizes set before optimizing it picks
the static kernels. The numbers must stay the generic plan's (and torch's) at every size, the
plans live in the artifact's one tract child, and the plans kept are bounded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import torchlower
from tests.test_cli import cli_json
from torchlower.errors import InvalidArgumentError
from torchlower.nnef import session as tract_session


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
    axes = {"x": {0: ("B", 1, 3), 2: "4*h", 3: "4*w"}}
    torchlower.export(model, torch.randn(1, 3, 16, 16), path, dynamic_axes=axes)
    return path, model


def _only(outputs: dict[str, np.ndarray]) -> np.ndarray:
    (value,) = outputs.values()
    return value


@pytest.mark.parametrize("isolated", [True, False])
def test_each_size_gets_its_own_plan(archive: tuple[Path, torch.nn.Module], isolated: bool) -> None:
    path, model = archive
    rng = np.random.default_rng(3)
    with torchlower.load(path) as art:
        for shape in ((1, 3, 16, 16), (2, 3, 24, 40), (1, 3, 16, 16)):  # the repeat hits its plan
            x = rng.standard_normal(shape).astype(np.float32)
            with torch.no_grad():
                want = model(torch.from_numpy(x)).numpy()
            sized = _only(art.run(x, specialize=True, isolated=isolated))
            generic = _only(art.run(x, isolated=isolated))
            assert sized.shape == generic.shape == want.shape
            np.testing.assert_allclose(sized, generic, rtol=0, atol=1e-6)
            assert np.abs(sized - want).max() < 1e-5
        plans = art._session.plans
        assert list(plans) == ["B=2,h=6,w=10", "B=1,h=4,w=4", ""], "one plan per size, last used last"
        assert plans["B=2,h=6,w=10"]["inputs"] == ["2,3,24,40,f32"], "tract sees fixed sizes"
        assert plans[""]["inputs"] == ["B,3,4*h,4*w,f32"], "the generic plan keeps its symbols"
        if isolated:
            pid = art._session.proc.pid
            art.run(np.zeros((3, 3, 8, 8), np.float32), specialize=True)
            assert art._session.proc.pid == pid, "a new size loads into the same child"


def test_plans_kept_are_bounded(archive: tuple[Path, torch.nn.Module]) -> None:
    path, _ = archive
    with torchlower.load(path) as art:
        art.run(np.zeros((1, 3, 4, 8), np.float32))
        for h in range(1, tract_session.KEPT + 3):
            art.run(np.zeros((1, 3, 4 * h, 8), np.float32), specialize=True)
        sized = [key for key in art._session.plans if key]
        assert sized == [f"B=1,h={h},w=2" for h in range(3, tract_session.KEPT + 3)], "LRU goes first"
        assert "" in art._session.plans, "the generic plan is never evicted"
        y = _only(art.run(np.ones((1, 3, 4, 8), np.float32), specialize=True))  # evicted: loads again
        assert y.shape == (1, 4, 1, 2)


@pytest.mark.parametrize(
    ("shape", "why"),
    [((1, 3, 17, 16), "not a multiple of 4"), ((4, 3, 16, 16), "outside the archive's bound B <= 3")],
)
def test_declaration_is_still_enforced(
    archive: tuple[Path, torch.nn.Module], shape: tuple[int, ...], why: str
) -> None:
    path, _ = archive
    x = np.zeros(shape, np.float32)
    with torchlower.load(path) as art:
        with pytest.raises(InvalidArgumentError, match=why) as generic:
            art.run(x)
        with pytest.raises(InvalidArgumentError, match=why) as sized:
            art.run(x, specialize=True)
        assert str(sized.value) == str(generic.value), "the same error either way"
        assert art._session is None, "nothing reached tract"


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
    assert data["ok"] and data["latency_ms"]["runs"] == 2 and data["latency_ms"]["first_call"] > 0
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    got = next(iter(np.load(tmp_path / "o.npz").values()))
    assert np.abs(got - want).max() < 1e-5

"""Real package classes of issue 30's "Done when": a kornia warp at a real image size and a
torch-geometric GCN on a small random graph, exported through ``auto`` and checked in tract.

kornia's ``warp_affine`` pads the matrix and writes ``H[..., -1, -1] += 1`` into the view
(item 4), inverts it and samples bilinearly; ``warp_perspective`` does the same with a 3×3
homography. torch-geometric's ``GCNConv`` removes self loops with a boolean mask
(``edge_index[:, edge_index[0] != edge_index[1]]``, item 6), adds them back, and scatters
normalized messages: its edge count is counted at run time (``tract_onnx_non_zero``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchlower

kornia = pytest.importorskip("kornia", reason="kornia is not installed (requirements-dev.txt)")
geometric = pytest.importorskip(
    "torch_geometric", reason="torch-geometric is not installed (requirements-dev.txt)"
)

IMAGE = (1, 3, 224, 224)
AFFINE = torch.tensor([[[0.9, 0.1, 5.0], [-0.1, 0.95, -3.0]]])
HOMOGRAPHY = torch.tensor([[[0.9, 0.1, 5.0], [-0.1, 0.95, -3.0], [1e-4, -2e-4, 1.0]]])


class WarpAffine(nn.Module):
    def forward(self, image: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
        return kornia.geometry.transform.warp_affine(image, matrix, dsize=(image.shape[-2], image.shape[-1]))


class WarpPerspective(nn.Module):
    """A fixed homography (a rectification): random 3×3 inputs are near-singular warps whose
    sampling grid amplifies float32 rounding past any tolerance, in torch as in tract."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("homography", HOMOGRAPHY.clone())

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        size = (image.shape[-2], image.shape[-1])
        return kornia.geometry.transform.warp_perspective(image, self.homography, dsize=size)


class GCN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = geometric.nn.GCNConv(8, 16)
        self.conv2 = geometric.nn.GCNConv(16, 4)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


class GAT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = geometric.nn.GATConv(8, 8, heads=2)
        self.conv2 = geometric.nn.GATConv(16, 4)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def _checked(report: torchlower.ExportReport, bound: float) -> None:
    assert report.points and all(p.ok for p in report.points if p.skipped is None), report.points
    assert report.max_abs_error <= bound, report.max_abs_error


def test_kornia_warp_affine_through_auto(tmp_path: Path) -> None:
    image = torch.rand(*IMAGE)
    report = torchlower.export(WarpAffine().eval(), (image, AFFINE), tmp_path / "m.nnef.tgz")
    assert report.frontend == "export", report.notes
    _checked(report, 1e-4)
    assert report.outputs[0].shape == IMAGE


@pytest.mark.parametrize("frontend", ["jit", "export"])
def test_kornia_warp_affine(frontend: str, tmp_path: Path) -> None:
    report = torchlower.export(WarpAffine().eval(), (torch.rand(*IMAGE), AFFINE), tmp_path / "m.nnef.tgz",
                               frontend=frontend)  # fmt: skip
    _checked(report, 1e-4)


def test_kornia_warp_perspective_through_auto(tmp_path: Path) -> None:
    report = torchlower.export(WarpPerspective().eval(), (torch.rand(*IMAGE),), tmp_path / "m.nnef.tgz")
    _checked(report, 1e-4)
    assert report.outputs[0].shape == IMAGE


def _graph(nodes: int, edges: int, loops: int) -> tuple[torch.Tensor, torch.Tensor]:
    e = torch.randint(0, nodes, (2, edges))
    e[1, :loops] = e[0, :loops]
    e[1, loops:] = (e[0, loops:] + 1 + torch.randint(0, nodes - 1, (edges - loops,))) % nodes
    return torch.randn(nodes, 8), e


def test_torch_geometric_gcn_through_auto(tmp_path: Path) -> None:
    model = GCN().eval()
    x, edge_index = _graph(20, 60, 7)
    report = torchlower.export(model, (x, edge_index), tmp_path / "m.nnef.tgz")
    assert report.frontend == "export", report.notes
    _checked(report, 1e-5)
    artifact = torchlower.load(report.path)
    for loops in (0, 12, 60):  # other self-loop counts: the kept edge count is read at run time
        x, edge_index = _graph(20, 60, loops)
        with torch.no_grad():
            want = model(x, edge_index).numpy()
        got = artifact.run([x, edge_index])["output"]
        assert got.shape == want.shape == (20, 4)
        assert float(np.abs(got - want).max()) <= 1e-5 * max(1.0, float(np.abs(want).max()))


def test_torch_geometric_gcn_through_jit(tmp_path: Path) -> None:
    x, edge_index = _graph(20, 60, 7)
    report = torchlower.export(GCN().eval(), (x, edge_index), tmp_path / "m.nnef.tgz", frontend="jit")
    _checked(report, 1e-5)


def test_torch_geometric_gat_through_auto(tmp_path: Path) -> None:
    """GATConv: self loops removed by mask and added back, attention softmax over each node's
    incoming edges (a scatter), two heads concatenated."""
    report = torchlower.export(GAT().eval(), _graph(20, 60, 7), tmp_path / "m.nnef.tgz")
    assert report.frontend == "export", report.notes
    _checked(report, 1e-5)


@pytest.mark.parametrize("model", [GCN, GAT])
def test_torch_geometric_through_fx(model: type[nn.Module], tmp_path: Path) -> None:
    """FX cannot trace into ``MessagePassing`` (``isinstance(edge_index, Tensor)`` is False for a
    proxy; GATConv asserts on it): each conv is kept whole and lowered through torch.export."""
    report = torchlower.export(model().eval(), _graph(20, 60, 7), tmp_path / "m.nnef.tgz", frontend="fx")
    _checked(report, 1e-5)
    kept = [n for n in report.notes if n.startswith("fx: lowered conv")]
    assert len(kept) == 2 and all("FX cannot trace it" in n for n in kept), report.notes


class WarpPerspectiveInput(nn.Module):
    def forward(self, image: torch.Tensor, homography: torch.Tensor) -> torch.Tensor:
        size = (image.shape[-2], image.shape[-1])
        return kornia.geometry.transform.warp_perspective(image, homography, dsize=size)


def test_kornia_warp_perspective_of_an_input_homography_is_no_false_alarm(tmp_path: Path) -> None:
    """Random 3×3 homographies are near-singular warps where torch-f32 itself is far off float64
    (issue 32): the check judges those points against float64 PyTorch instead of refusing."""
    report = torchlower.export(
        WarpPerspectiveInput().eval(), (torch.rand(*IMAGE), HOMOGRAPHY), tmp_path / "m.nnef.tgz"
    )
    random = [p for p in report.points if p.label.startswith("random")]
    assert random and all(p.ok for p in random), report.points
    notes = [e.note for p in random for e in p.errors if e.note]
    assert notes and all("ill-conditioned here" in n for n in notes), notes
    example = next(p for p in report.points if p.label == "example")
    assert example.ok and max(e.max_abs for e in example.errors) < 1e-4  # the well-conditioned example

"""Sizes that must be multiples (issue 28, items 1 and 2): a U-Net needs H and W divisible by its
total stride. Declared (``"8*h"``, ``8*Dim("h")``, ``--dynamic x:2=8*h``) or found (torch.export's
``H = 32*_H``, PyTorch failing off the multiple), the archive declares ``[1, 3, 8 * h, 8 * w]``,
runs in tract at several multiples, and ``run`` refuses the other sizes. A size-1 example does
not pin its axis under torch.export (captured at size 2, checked at 1)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import torchlower
from tests.test_cli import cli_json
from torchlower.errors import DynamicAxisError, InvalidArgumentError

Dim = torch.export.Dim
FRONTENDS = ("export", "jit", "fx")


class UNet(nn.Module):
    """``depth`` stride-2 convs down, nearest ×2 up with skip concatenations: total stride
    ``2**depth``; PyTorch fails at any other size (the concatenation's sizes differ)."""

    def __init__(self, depth: int, to_size: bool = False) -> None:
        super().__init__()
        torch.manual_seed(depth)
        self.to_size = to_size  # interpolate to the skip's size (segmentation_models_pytorch)
        self.stem = nn.Conv2d(3, 4, 3, 1, 1)
        self.downs = nn.ModuleList(nn.Conv2d(4, 4, 3, 2, 1) for _ in range(depth))
        self.ups = nn.ModuleList(nn.Conv2d(8, 4, 3, 1, 1) for _ in range(depth))
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, skips = self.stem(x), []
        for down in self.downs:
            skips.append(x)
            x = torch.relu(down(x))
        for up, skip in zip(self.ups, reversed(skips), strict=True):
            if self.to_size:
                x = nn.functional.interpolate(x, size=skip.shape[2:], mode="bilinear")
            else:
                x = nn.functional.interpolate(x, scale_factor=2, mode="nearest")
            x = torch.relu(up(torch.cat([x, skip], 1)))
        return self.head(x)


class OddUNet(nn.Module):
    """Unpadded 3×3 stride-2 convs down, 3×3 stride-2 transposed convs up, skips added: runs only
    at H = 4*h + 3 (7, 11, 15…), torch.export's ``H = 4*_H - 1``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.stem = nn.Conv2d(3, 4, 1)
        self.downs = nn.ModuleList(nn.Conv2d(4, 4, 3, 2, 0) for _ in range(2))
        self.ups = nn.ModuleList(nn.ConvTranspose2d(4, 4, 3, 2, 0) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x, skips = self.stem(x), []
        for down in self.downs:
            skips.append(x)
            x = torch.relu(down(x))
        for up, skip in zip(self.ups, reversed(skips), strict=True):
            x = torch.relu(up(x)) + skip
        return x


class Branchy(nn.Module):
    """Runs at every size, but branches on ``H % 32``: torch.export asks for ``H = 32*_H``."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[2] % 32 == 0 else x * 3


def unet3() -> nn.Module:
    """The CLI's factory (``tests.test_dynamic_multiples:unet3``)."""
    return UNet(3).eval()


def run_at(path: Path, model: nn.Module, sizes: list[tuple[int, int]], batch: int = 1) -> float:
    """Run the archive in tract at every (H, W) and compare with PyTorch; the worst error."""
    worst = 0.0
    with torchlower.load(path) as art:
        for h, w in sizes:
            x = torch.randn(batch, 3, h, w, generator=torch.Generator().manual_seed(h * 100 + w))
            with torch.no_grad():
                want = model(x).numpy()
            got = art.run([x.numpy()])["output"]
            assert got.shape == want.shape, (h, w)
            worst = max(worst, float(np.abs(got - want).max()))
    assert worst < 1e-4
    return worst


def _graph(path: Path) -> str:
    import tarfile

    with tarfile.open(path) as tar:
        return tar.extractfile("graph.nnef").read().decode()  # type: ignore[union-attr]


def _checked(report: torchlower.ExportReport) -> list[tuple[int, ...]]:
    """The input shapes the export's own check compared (not skipped), one per point."""
    return sorted({tuple(p.inputs[0]) for p in report.points if p.ok and not p.skipped})


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_declared_multiple_runs_at_every_multiple(frontend: str, tmp_path: Path) -> None:
    model = UNet(3).eval()
    path = tmp_path / "m.nnef.tgz"
    report = torchlower.export(
        model, torch.randn(1, 3, 16, 24), path, frontend=frontend, dynamic_axes={"x": {2: "8*h", 3: "w*8"}}
    )
    assert report.frontend == frontend and report.inputs[0].shape == (1, 3, "8 * h", "8 * w")
    assert "shape = [1, 3, 8 * h, 8 * w]" in _graph(path)
    heights = {s[2] for s in _checked(report)}
    assert len(heights) >= 3 and all(h % 8 == 0 for h in heights)  # the example and 2+ multiples
    run_at(path, model, [(8, 8), (24, 40), (48, 16), (64, 64)])
    with torchlower.load(path) as art, pytest.raises(InvalidArgumentError) as info:
        art.run([np.zeros((1, 3, 20, 16), np.float32)])
    assert "input 'x' axis 2" in str(info.value) and "20 is not a multiple of 8" in str(info.value)


@pytest.mark.parametrize("frontend", [*FRONTENDS, "auto"])
def test_needed_multiple_is_adopted(frontend: str, tmp_path: Path) -> None:
    """Declared as plain H and W; PyTorch fails off the multiple of 32: adopted and reported."""
    model = UNet(5).eval()
    path = tmp_path / "m.nnef.tgz"
    report = torchlower.export(
        model, torch.randn(1, 3, 64, 96), path, frontend=frontend, dynamic_axes={"x": {2: "H", 3: "W"}}
    )
    assert report.frontend == ("export" if frontend == "auto" else frontend)
    assert report.inputs[0].shape == (1, 3, "32 * _H", "32 * _W")
    notes = " ".join(report.notes)
    assert "H = 32*_H" in notes and "W = 32*_W" in notes and "multiple of 32" in notes
    assert "extension tract_symbol _H;" in _graph(path)
    assert len({s[2] for s in _checked(report)}) >= 3
    run_at(path, model, [(32, 32), (96, 64), (128, 160)])
    with (
        torchlower.load(path) as art,
        pytest.raises(InvalidArgumentError, match="65 is not a multiple of 32"),
    ):
        art.run([np.zeros((1, 3, 65, 64), np.float32)])


def test_offset_multiple_is_adopted(tmp_path: Path) -> None:
    model = OddUNet().eval()
    path = tmp_path / "m.nnef.tgz"
    report = torchlower.export(model, torch.randn(1, 3, 7, 11), path, dynamic_axes={"x": {2: "H", 3: "W"}})
    assert report.inputs[0].shape[2:] == ("(3 + 4 * _H)", "(3 + 4 * _W)")
    assert "H = 4*_H + 3" in " ".join(report.notes)
    run_at(path, model, [(7, 7), (11, 19), (23, 15)])
    with (
        torchlower.load(path) as art,
        pytest.raises(InvalidArgumentError, match="not 3 more than a multiple of 4"),
    ):
        art.run([np.zeros((1, 3, 9, 11), np.float32)])


def test_derived_dims_in_dynamic_shapes(tmp_path: Path) -> None:
    """torch.export's own spelling, an offset and bounds on the root included."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU()).eval()
    path = tmp_path / "m.nnef.tgz"
    h, w = Dim("h"), Dim("w", max=6)
    report = torchlower.export(
        model, torch.randn(2, 3, 16, 17), path, frontend="export",
        dynamic_shapes={"input": {2: 8 * h, 3: w * 8 + 1}},
    )  # fmt: skip
    assert report.inputs[0].shape == (2, 3, "8 * h", "(1 + 8 * w)")
    assert "extension tract_assert w <= 6;" in _graph(path)
    assert all(s[3] % 8 == 1 and s[3] <= 49 for s in _checked(report))
    run_at(path, model, [(8, 9), (40, 49)], batch=2)
    with torchlower.load(path) as art:
        with pytest.raises(InvalidArgumentError, match="not 1 more than a multiple of 8"):
            art.run([np.zeros((2, 3, 8, 16), np.float32)])
        bound = r"axis 3: w = 7 \(size 57\) is outside the archive's bound w <= 6"
        with pytest.raises(InvalidArgumentError, match=bound):
            art.run([np.zeros((2, 3, 8, 57), np.float32)])


def test_multiple_torch_export_needs_but_pytorch_does_not(tmp_path: Path) -> None:
    """torch.export's ``H = 32*_H`` for a model that runs at every size: not adopted (it would
    restrict the archive); the error names the multiple and the spellings."""
    with pytest.raises(DynamicAxisError) as info:
        torchlower.export(
            Branchy(), torch.randn(1, 3, 64, 64), tmp_path / "m.nnef", frontend="export",
            dynamic_axes={"x": {2: "H"}},
        )  # fmt: skip
    message = str(info.value)
    assert "multiple of 32" in message and "fixes H to 32" not in message
    assert "{'x': {2: '32*h'}}" in message and "32*Dim('h')" in message


@pytest.mark.parametrize(
    ("axes", "culprit"),
    [({2: "8*h*w"}, "'8\\*h\\*w'"), ({2: "h/8"}, "'h/8'"), ({2: "0*h"}, "'0\\*h'"),
     ({2: "8*h+"}, "'8\\*h\\+'"), ({2: "8*h"}, "20 .*not a multiple of 8")],
)  # fmt: skip
def test_bad_multiple_spellings(axes: dict[int, str], culprit: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=culprit):
        torchlower.export(UNet(2), torch.randn(1, 3, 20, 16), tmp_path / "m.nnef", dynamic_axes={"x": axes})


@pytest.mark.parametrize("frontend", [*FRONTENDS, "auto"])
def test_batch_one_example_keeps_the_batch_dynamic(frontend: str, tmp_path: Path) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.Linear(4 * 6 * 6, 2)).eval()
    path = tmp_path / "m.nnef.tgz"
    report = torchlower.export(
        model, torch.randn(1, 3, 8, 8), path, frontend=frontend, dynamic_axes={"input": {0: "B"}}
    )
    assert report.frontend == ("export" if frontend == "auto" else frontend)
    assert report.inputs[0].shape == ("B", 3, 8, 8)
    if report.frontend == "export":
        assert any("captured at B=2" in n for n in report.notes), report.notes
    batches = {s[0] for s in _checked(report)}
    assert 1 in batches and len(batches) >= 2  # the example's size is checked, and another
    with torchlower.load(path) as art:
        for b in (1, 3, 5):
            x = torch.randn(b, 3, 8, 8)
            with torch.no_grad():
                assert np.abs(art.run([x.numpy()])["output"] - model(x).numpy()).max() < 1e-5


def test_multiple_with_root_one_under_export(tmp_path: Path) -> None:
    """H = 8 is h = 1, which torch.export would pin: captured at h = 2, checked at h = 1."""
    model = UNet(3).eval()
    path = tmp_path / "m.nnef.tgz"
    report = torchlower.export(
        model, torch.randn(1, 3, 8, 16), path, frontend="export", dynamic_axes={"x": {2: "8*h", 3: "8*w"}}
    )
    assert (1, 3, 8, 16) in _checked(report)
    run_at(path, model, [(8, 8), (16, 40)])


class EncoderAfterLinear(nn.Module):
    """A ``torch.nn`` leaf FX keeps whole (``nn.TransformerEncoderLayer``): lowered through
    torch.export of that module alone, on the example's batch of 1."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(8, 8)
        self.inner = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.lin(x))


def test_batch_one_does_not_pin_a_leaf_fx_hands_to_torch_export(tmp_path: Path) -> None:
    """FX's torch.export of a leaf moves a symbol at 1 to 2 as the export front end does
    (ultralytics' Detect head under fx): B stays dynamic, checked at B = 1 (the example) too."""
    model, path = EncoderAfterLinear().eval(), tmp_path / "m.nnef.tgz"
    report = torchlower.export(model, torch.randn(1, 5, 8), path, frontend="fx", dynamic_axes={"x": {0: "B"}})
    assert report.inputs[0].shape == ("B", 5, 8) and report.max_abs_error < 1e-5
    x = torch.randn(3, 5, 8)
    with torch.no_grad():
        assert np.abs(torchlower.load(path).run([x.numpy()])["output"] - model(x).numpy()).max() < 1e-5


def test_cli_spelling(tmp_path: Path) -> None:
    path = tmp_path / "m.nnef.tgz"
    data = cli_json(
        "export", "tests.test_dynamic_multiples:unet3", "-o", path, "--input", "x:1x3x16x24",
        "--dynamic", "x:2=8*h", "--dynamic", "x:3=8*w[1..4]",
    )  # fmt: skip
    assert data["ok"] and data["inputs"][0]["shape"] == [1, 3, "8 * h", "8 * w"]
    assert all(p["inputs"][0][3] <= 32 for p in data["points"])
    assert "extension tract_assert w <= 4;" in _graph(path)


class Unread(nn.Module):
    """A 2×2 stride-2 conv on ``8*h + 1`` rows: the last row is read by no window."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.down = nn.Conv2d(3, 3, 2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up = nn.functional.interpolate(self.down(x), scale_factor=2, mode="nearest")
        return up + x[:, :, :-1, :-1]


@pytest.mark.parametrize("frontend", ["export", "jit"])
def test_guard_windows_read_no_unused_padding(frontend: str, tmp_path: Path) -> None:
    """tract 0.23.9 cannot simplify ``(7 + 8*h) / 8`` to ``h`` (the decoder's reshape then fails
    to load): on multiples, padding past the last window is dropped (``(1, 1)`` → ``(1, 0)``) and
    unread rows are sliced off (``nnef/guards_windows.py``); the numbers are the same."""
    path = tmp_path / "u.nnef.tgz"
    torchlower.export(UNet(3).eval(), torch.randn(1, 3, 16, 24), path, frontend=frontend,
                      dynamic_axes={"x": {2: "8*h", 3: "8*w"}})  # fmt: skip
    assert "padding = [(1, 0), (1, 0)], stride = [2, 2]" in _graph(path)
    model, path = Unread().eval(), tmp_path / "r.nnef.tgz"
    torchlower.export(model, torch.randn(1, 3, 17, 25), path, frontend=frontend,
                      dynamic_axes={"x": {2: "8*h + 1", 3: "8*w + 1"}})  # fmt: skip
    assert "end = [(8 * h), (8 * w)]" in _graph(path) or "end = [8 * h, 8 * w]" in _graph(path)
    run_at(path, model, [(9, 9), (33, 17), (41, 57)])


@pytest.mark.parametrize("frontend", ["export", "jit", "fx"])
def test_decoder_interpolating_to_the_skip_size(frontend: str, tmp_path: Path) -> None:
    """``interpolate(x, size=skip.shape[2:])`` on ``4*h`` to ``8*h`` is a whole factor of 2
    (segmentation_models_pytorch's U-Net decoder); FX passes the symbolic size to the ATen rule
    (``frontends/fx_interpolate.py``) rather than torch.export's baked integers."""
    model, path = UNet(3, to_size=True).eval(), tmp_path / "m.nnef.tgz"
    torchlower.export(model, torch.randn(1, 3, 16, 24), path, frontend=frontend,
                      dynamic_axes={"x": {2: "8*h", 3: "8*w"}})  # fmt: skip
    run_at(path, model, [(8, 8), (32, 48), (56, 24)])

"""Size fits that hold at every size (issue 28, items 3 and 6).

Sizes that follow floor divisions (STFT framing, strided conv stacks, a wav2vec2 feature
extractor with total stride 320) are exported with a dynamic length and run in tract at lengths
far from every capture, compared with PyTorch there; a fit that only matched the sampled
lengths would give wrong numbers or a refused archive. A size the captures cannot decide is a
typed error naming it; fitting a U-Net's sizes is linear in its nodes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

import torchlower
from torchlower.core.dynamic import Spec
from torchlower.core.size_fit import SizeFitter
from torchlower.core.size_forms import floor_forms
from torchlower.errors import DynamicAxisError, LoweringError
from torchlower.nnef.tract import run_in_tract

FAR = (16000, 16001, 23456, 999)  # lengths none of the captures (around T = 4000) comes near


def worst_error(path: Path, model: nn.Module, x: torch.Tensor) -> float:
    """max |torch - tract| / max |torch| at input ``x`` (shapes must agree)."""
    with torch.no_grad():
        want = model(x).numpy()
    (got,) = run_in_tract(path, [x.numpy()])
    assert got.shape == want.shape, f"at {tuple(x.shape)}: {got.shape} != {want.shape}"
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-6))


def export_t(model: nn.Module, x: torch.Tensor, tmp_path: Path, frontend: str) -> torchlower.ExportReport:
    name = "input" if isinstance(model, nn.Sequential) else "x"
    return torchlower.export(
        model.eval(),
        (x,),
        tmp_path / "m.nnef.tgz",
        frontend=frontend,
        dynamic_axes={name: {x.dim() - 1: "T"}},
    )


class Framing(nn.Module):
    """STFT-like framing: (T - 400) // 160 + 1 frames, and the frame count scales the output."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("window", torch.randn(3, 1, 400) / 20)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = F.conv1d(x.unsqueeze(1), self.window, stride=160)
        return frames * frames.shape[-1]


class StrideTwo(nn.Module):
    """Four convs with kernel 3, stride 2, padding 1: (T + 1) // 2 four times, i.e. ceil(T / 16)
    (sampled near T = 1000, ``T // 16 + 1`` fits too and is wrong at every multiple of 16)."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.Sequential(*[nn.Conv1d(4, 4, 3, 2, 1) for _ in range(4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.convs(x)
        return y * y.shape[-1]


class FeatureExtractor(nn.Module):
    """wav2vec2's conv feature extractor (kernels 10,3,3,3,3,2,2, strides 5,2,2,2,2,2,2: total
    stride 320), frames flattened with their channels and scaled by the frame count."""

    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for k, (kernel, stride) in enumerate(zip((10, 3, 3, 3, 3, 2, 2), (5, 2, 2, 2, 2, 2, 2), strict=True)):
            layers += [nn.Conv1d(1 if k == 0 else 8, 8, kernel, stride), nn.GELU()]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.net(x)
        return y.transpose(1, 2).reshape(y.shape[0], -1) * y.shape[-1]


@pytest.mark.parametrize("frontend", ["jit", "auto"])
@pytest.mark.parametrize(
    ("model", "shape"),
    [(Framing, (1, 4000)), (StrideTwo, (1, 4, 1000)), (FeatureExtractor, (1, 1, 4000))],
    ids=["framing", "stride-two", "wav2vec2-features"],
)
def test_floor_sizes_hold_far_from_the_captures(
    tmp_path: Path, frontend: str, model: type, shape: tuple
) -> None:
    torch.manual_seed(0)
    m = model().eval()
    report = export_t(m, torch.randn(*shape), tmp_path, frontend)
    assert report.max_abs_error < 1e-3
    for t in FAR:
        assert worst_error(report.path, m, torch.randn(*shape[:-1], t)) < 1e-4, f"T={t}"


class FramingPositions(nn.Module):
    """The framing of ``Framing`` through ``F.conv1d``, the frame count used as positions."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("window", torch.randn(3, 1, 400) / 20)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        frames = F.conv1d(x.unsqueeze(1), self.window, stride=160)
        return frames + torch.arange(frames.shape[-1], dtype=frames.dtype) / 10


@pytest.mark.parametrize(
    ("model", "shape"),
    [
        (
            lambda: nn.Sequential(*[nn.Conv1d(4, 4, 3, 2, 1) for _ in range(4)], nn.Conv1d(4, 2, 10, 5)),
            (1, 4, 1000),
        ),
        (FramingPositions, (1, 4000)),
    ],
    ids=["modules", "functional"],
)
def test_strided_sizes_through_fx(tmp_path: Path, model: type, shape: tuple) -> None:
    """FX fits the same way (its runs take the place of the traces)."""
    torch.manual_seed(0)
    m = model().eval()
    report = export_t(m, torch.randn(*shape), tmp_path, "fx")
    assert report.frontend == "fx"
    for t in FAR:
        assert worst_error(report.path, m, torch.randn(*shape[:-1], t)) < 1e-4, f"T={t}"


class Transposed(nn.Module):
    """Deep in a CNN the sizes of H and W are equal at every first capture (H // 4 and W // 4 at
    H, W = 64..68): fitting must not take one for the other."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.avg_pool2d(x, 4).transpose(2, 3)
        rows = torch.arange(y.shape[2], dtype=y.dtype).reshape(-1, 1)
        return y + rows + torch.arange(y.shape[3], dtype=y.dtype) / 100


@pytest.mark.parametrize("frontend", ["jit", "fx"])
def test_equal_sizes_of_two_symbols_stay_apart(tmp_path: Path, frontend: str) -> None:
    m = Transposed()
    report = torchlower.export(
        m,
        torch.randn(1, 2, 64, 64),
        tmp_path / "m.nnef.tgz",
        frontend=frontend,
        dynamic_axes={"x": {2: "H", 3: "W"}},
    )
    assert report.outputs[0].shape[2:] == ("(W / 4)", "(H / 4)")
    for h, w in ((96, 160), (63, 200), (301, 17)):
        assert worst_error(report.path, m, torch.randn(1, 2, h, w)) < 1e-5, f"H={h}, W={w}"


class Skip160(nn.Module):
    """Every 160th sample: ceil(T / 160), from an op without a size rule (a strided slice)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x[:, ::160]
        return y * y.shape[-1]


def test_undecided_size_is_a_typed_error_and_auto_moves_on(tmp_path: Path) -> None:
    """jit sees ceil(T / 160) at a few lengths and, within its extra captures, cannot rule out
    its neighbours (``(T + 157) / 160``…): it says so, and ``auto`` exports through torch.export."""
    x = torch.randn(2, 4100)
    axes = {"x": {1: ("T", 161, None)}}  # torch.export's own condition (the slice longer than 1)
    with pytest.raises(DynamicAxisError) as caught:
        torchlower.export(Skip160(), (x,), tmp_path / "m.nnef.tgz", frontend="jit", dynamic_axes=axes)
    text = str(caught.value)
    assert "input 'x' axis 1 (T) cannot be dynamic" in text and "aten::slice" in text
    assert "not decided by the captures" in text and "26 at T=4100" in text  # the size, where seen
    report = torchlower.export(Skip160(), (x,), tmp_path / "m.nnef.tgz", dynamic_axes=axes)
    assert report.frontend == "export"
    for t in FAR:
        assert worst_error(report.path, Skip160(), torch.randn(2, t)) < 1e-5, f"T={t}"


def _block(i: int, o: int) -> nn.Module:
    return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.ReLU(), nn.Conv2d(o, o, 3, padding=1), nn.ReLU())


class UNet(nn.Module):
    """Five levels down (max pool 2) and up (transposed conv 2), skips cropped and concatenated."""

    def __init__(self, levels: int = 5, width: int = 2) -> None:
        super().__init__()
        chs = [width * 2**i for i in range(levels + 1)]
        self.inc = _block(1, chs[0])
        self.downs = nn.ModuleList([_block(chs[i], chs[i + 1]) for i in range(levels)])
        self.ups = nn.ModuleList(
            [nn.ConvTranspose2d(chs[i + 1], chs[i], 2, 2) for i in reversed(range(levels))]
        )
        self.merge = nn.ModuleList([_block(2 * chs[i], chs[i]) for i in reversed(range(levels))])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        skips = [self.inc(x)]
        for down in self.downs:
            skips.append(down(F.max_pool2d(skips[-1], 2)))
        y = skips.pop()
        for up, merge in zip(self.ups, self.merge, strict=True):
            y = up(y)
            y = merge(torch.cat([skips.pop()[:, :, : y.shape[2], : y.shape[3]], y], 1))
        return y


def test_unet_with_dynamic_height_and_width(tmp_path: Path) -> None:
    """Fitting the sizes of a 5-level U-Net completes (it stalled in sympy before) and the
    archive runs at sizes whose levels round differently from the captures'."""
    torch.manual_seed(0)
    m = UNet().eval()
    report = torchlower.export(
        m,
        torch.randn(1, 1, 64, 64),
        tmp_path / "u.nnef.tgz",
        frontend="jit",
        dynamic_axes={"x": {2: "H", 3: "W"}},
    )
    assert report.outputs[0].shape[2:] == ("32 * (H / 32)", "32 * (W / 32)")
    for h, w in ((96, 80), (127, 65), (33, 190)):
        assert worst_error(report.path, m, torch.randn(1, 1, h, w)) < 1e-4, f"H={h}, W={w}"


# ---- the fitter itself: pure integer arithmetic over observations -------------------------


def _spec(base: int = 1000) -> Spec:
    spec = Spec.build({"x": {1: "T"}}, ["x"], [torch.zeros(1, base)])
    assert spec is not None
    return spec


def test_the_true_floor_is_among_the_candidates_and_alone_when_proven() -> None:
    spec = _spec()
    t = np.array([p["T"] for p in spec.points])
    forms, _ = floor_forms(t, (t - 240) // 160)
    assert (1, 160, 80, -2) in forms and len(forms) > 1  # the sampled lengths alone do not decide
    fitter = SizeFitter(spec, "jit")
    fitter.begin()
    assert fitter.size((t + 1) // 2, [tuple(t)], "half") is not None  # stride 2: decided
    assert fitter.size((t - 240) // 160, [tuple(t)], "frames") is None  # undecided: more captures
    assert fitter.wanted(), "the fitter names sizes to capture at"


def test_fitting_work_is_linear_in_the_nodes() -> None:
    """A chain of N stride-2 levels with N elementwise nodes after each: the search runs once per
    distinct size, so twice the nodes cost at most about twice the work."""
    spec = _spec(1 << 12)

    def work(levels: int, repeat: int) -> tuple[int, int]:
        fitter = SizeFitter(spec, "jit")
        fitter.begin()
        u = np.array([p["T"] for p in spec.points])
        for _ in range(levels):
            m = (u + 1) // 2
            for _ in range(repeat):  # relu, batch norm… the same size again
                assert fitter.size(m, [tuple(u)], "level") is not None
            u = m
        assert fitter.complete()
        return fitter.work, len(fitter.cache)

    small, big = work(5, 20), work(10, 40)
    assert big[1] <= 2 * small[1] and big[0] <= 2.5 * small[0]


def test_a_spent_work_budget_is_a_typed_error_naming_the_front_end() -> None:
    spec = _spec()
    t = np.array([p["T"] for p in spec.points])
    fitter = SizeFitter(spec, "fx", budget=10)
    fitter.begin()
    with pytest.raises(LoweringError, match="the fx front end gave up fitting"):
        fitter.size((t - 240) // 160, [tuple(t)], "frames")

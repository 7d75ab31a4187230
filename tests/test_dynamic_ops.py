"""Ops real models apply to dynamic sizes (issue 28, item 7): statistics over a dynamic dim, an
``empty`` buffer of a symbolic size, the shape as a tensor, ``F.affine_grid`` under jit and a
size used as a tensor operand (``x * (T % 4)``). Each is checked in tract at the example and at
other sizes (the report's points), through every front end that can capture it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlower
import torchlower.artifact.io


class Stats(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x.std(dim=1, keepdim=True) + x.var(dim=1, unbiased=False, keepdim=True)
        std, mean = torch.std_mean(x, dim=(1, 2))
        return a.sum(-1) + (std + mean).unsqueeze(1) + torch.var(x, dim=1, correction=2).mean(-1, True)


class EmptyBuffer(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.empty(x.shape, memory_format=torch.contiguous_format).fill_(1.5)


class ShapeTensor(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch._shape_as_tensor(x)[1].float()


class SizeOperand(nn.Module):
    """A size and its quotient and remainder as tensor operands."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        n, r = t // 4, t % 4
        return x * (r + 1) + n - t


class AffineGrid(nn.Module):
    def __init__(self, align_corners: bool) -> None:
        super().__init__()
        self.align_corners = align_corners
        self.theta = nn.Parameter(torch.tensor([[[0.9, 0.2, 0.1], [-0.15, 0.8, -0.05]]]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grid = F.affine_grid(self.theta.expand(x.shape[0], 2, 3), list(x.shape), self.align_corners)
        return F.grid_sample(x, grid, align_corners=self.align_corners)


def _export(model: nn.Module, x: torch.Tensor, axes: dict[int, str], frontend: str, tmp: Path):
    report = torchlower.export(
        model.eval(), x, tmp / "m.nnef.tgz", frontend=frontend, input_names=["x"], dynamic_axes={"x": axes}
    )
    sizes = [p for p in report.points if "=" in p.label]
    assert len(sizes) >= 2 and all(p.ok for p in report.points if p.label != "special values"), report.points
    return report


@pytest.mark.parametrize("frontend", ["jit", "fx", "export"])
def test_statistics_over_a_dynamic_dim(frontend: str, tmp_path: Path) -> None:
    report = _export(Stats(), torch.randn(2, 7, 5), {0: "B", 1: "T"}, frontend, tmp_path)
    assert report.max_abs_error < 1e-5
    assert report.op_histogram["mean_reduce"] > 0  # the count comes from the tensor, not the example


@pytest.mark.parametrize("frontend", ["jit", "fx", "export"])
def test_empty_buffer_of_a_symbolic_size(frontend: str, tmp_path: Path) -> None:
    assert _export(EmptyBuffer(), torch.randn(2, 7), {1: "T"}, frontend, tmp_path).max_abs_error == 0


@pytest.mark.parametrize("frontend", ["jit", "fx"])
def test_shape_as_tensor(frontend: str, tmp_path: Path) -> None:
    report = _export(ShapeTensor(), torch.randn(2, 7), {1: "T"}, frontend, tmp_path)
    assert report.max_abs_error == 0 and report.op_histogram["tract_core_shape_of"] == 1


@pytest.mark.parametrize("frontend", ["jit", "fx"])
def test_sizes_as_tensor_operands(frontend: str, tmp_path: Path) -> None:
    assert _export(SizeOperand(), torch.randn(2, 13), {1: "T"}, frontend, tmp_path).max_abs_error == 0


@pytest.mark.parametrize("align_corners", [False, True])
def test_affine_grid_under_jit(align_corners: bool, tmp_path: Path) -> None:
    report = _export(
        AffineGrid(align_corners), torch.randn(1, 2, 8, 9), {0: "B", 2: "H", 3: "W"}, "jit", tmp_path
    )
    assert report.max_abs_error < 1e-5 and "affine_grid_generator" not in str(report.notes)


class PositionIds(nn.Module):
    """transformers' ``create_position_ids_from_input_ids`` (Speech2Text, RoBERTa): a cumsum of a
    padding mask over the dynamic axis, and a float cumsum over it."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = (x[..., 0] > 0).int()
        positions = (torch.cumsum(mask, dim=1).type_as(mask) * mask).long() + 1
        return positions, torch.cumsum(x, 1)


@pytest.mark.parametrize("frontend", ["jit", "fx", "export"])
def test_cumsum_over_a_dynamic_dim(frontend: str, tmp_path: Path) -> None:
    report = _export(PositionIds(), torch.randn(2, 7, 3), {1: "T"}, frontend, tmp_path)
    assert report.max_abs_error < 1e-5 and report.op_histogram["matmul"] == 2
    x = torch.randn(2, 61, 3)
    got = torchlower.load(report.path).run([x.numpy()])
    want = PositionIds()(x)
    assert (got["output_0"] == want[0].numpy()).all(), "integer positions are exact"
    assert abs(got["output_1"] - want[1].numpy()).max() < 1e-4


class StarArgs(nn.Module):
    """ultralytics' ``forward(self, x, *args, **kwargs)``, called with ``x`` alone."""

    def forward(self, x: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        return x.relu() * 2


def test_star_args_forward_called_with_one_tensor(tmp_path: Path) -> None:
    report = _export(StarArgs(), torch.randn(2, 7), {1: "T"}, "export", tmp_path)
    assert report.frontend == "export" and report.max_abs_error == 0


class SizeAsFlag(nn.Module):
    """``is_causal`` computed from a size: a tensor under jit, a SymBool under torch.export."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = x.unsqueeze(1)
        return F.scaled_dot_product_attention(q, q, q, is_causal=x.shape[1] > 1)


def test_no_raw_exception_from_any_front_end(tmp_path: Path) -> None:
    """jit's TypeError becomes a TraceError naming the model's line; auto notes every front end."""
    with pytest.raises(torchlower.errors.TraceError, match=r"test_dynamic_ops.py:\d+") as caught:
        torchlower.export(
            SizeAsFlag(), torch.randn(2, 6, 4), tmp_path / "m.nnef.tgz", frontend="jit",
            dynamic_axes={"x": {1: "T"}},
        )  # fmt: skip
    assert "TypeError" in str(caught.value) and "is_causal" in str(caught.value)
    with pytest.raises(torchlower.errors.TorchlowerError) as auto:
        torchlower.export(
            SizeAsFlag(), torch.randn(2, 6, 4), tmp_path / "a.nnef.tgz", dynamic_axes={"x": {1: "T"}}
        )
    notes = "\n".join(getattr(auto.value, "__notes__", []))
    assert all(f"{fe} front end skipped" in notes for fe in ("jit", "fx")), notes
    assert not (tmp_path / "a.nnef.tgz").exists()


class LogMel(nn.Module):
    """A Whisper-style log-mel front end: centred STFT (reflect padding needs T > n_fft / 2)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("window", torch.hann_window(400))
        self.register_buffer("filters", torch.rand(201, 40))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.stft(x, 400, 160, window=self.window, return_complex=True, center=True)
        return torch.log(torch.clamp(torch.matmul(s.abs().pow(2).transpose(-1, -2), self.filters), min=1e-10))


def test_stft_bound_adopted_under_export(tmp_path: Path) -> None:
    """torch.export needs T >= 201 (PyTorch fails at 200), then only asks whether the frame count
    is 1: the bound is adopted, the export is size-oblivious, and the check runs at the bound."""
    report = _export(LogMel(), torch.randn(1, 16000), {1: "T"}, "export", tmp_path)
    assert report.frontend == "export" and report.max_abs_error < 1e-4
    assert any("201 <= T" in n for n in report.notes) and "T=201" in {p.label for p in report.points}


class PositionTable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pos = nn.Parameter(torch.randn(64, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.pos[: x.shape[1]]


@pytest.mark.parametrize("frontend", ["jit", "fx", "export"])
def test_table_sliced_to_a_size_bounds_it(frontend: str, tmp_path: Path) -> None:
    """A 64-row table sliced to T holds for T <= 64 only (PyTorch fails beyond): the bound is
    adopted with a note and asserted in the archive, not left for tract to fail on."""
    report = _export(PositionTable(), torch.randn(2, 6, 4), {1: "T"}, frontend, tmp_path)
    assert any("T <= 64" in n for n in report.notes), report.notes  # ours, or torch.export's bound
    text = torchlower.artifact.io.graph_text(report.path)
    assert "extension tract_assert T <= 64;" in text


class RelativeEinsum(nn.Module):
    """Wav2Vec2-BERT's relative-position attention term: an einsum broadcasting over T."""

    def __init__(self) -> None:
        super().__init__()
        self.distance = nn.Parameter(torch.randn(1, 1, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = x.unsqueeze(1)  # [B, 1, T, 4]
        return torch.einsum("bhld,lrd->bhlr", q, q[0].transpose(0, 1) * self.distance)


@pytest.mark.parametrize("frontend", ["jit", "fx", "export"])
def test_einsum_broadcast_over_a_dynamic_dim(frontend: str, tmp_path: Path) -> None:
    assert _export(RelativeEinsum(), torch.randn(2, 6, 4), {1: "T"}, frontend, tmp_path).max_abs_error < 1e-5


class ShapeCache(nn.Module):
    """ultralytics' Detect head: a table rebuilt when the input shape differs from the last one."""

    def __init__(self) -> None:
        super().__init__()
        self.shape: torch.Size | None = None
        self.table: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.shape != x.shape:
            self.table, self.shape = torch.arange(x.shape[1], dtype=x.dtype).expand(x.shape[0], -1), x.shape
        return x * self.table


def test_caches_left_by_eager_runs_do_not_pin_an_axis(tmp_path: Path) -> None:
    """The eager runs before tracing (example, check sizes, probes) leave the model as given,
    so torch.export traces the rebuild, not a comparison with the last probed shape."""
    model = ShapeCache()
    report = _export(model, torch.randn(1, 6), {0: "B", 1: "T"}, "export", tmp_path)
    assert report.frontend == "export" and report.max_abs_error == 0


class UpAligned(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=True)


@pytest.mark.parametrize("frontend", ["jit", "fx", "export"])
def test_aligned_bilinear_upsampling_over_dynamic_sizes(frontend: str, tmp_path: Path) -> None:
    """align_corners=True weights depend on the size (j·(n−1)/(2n−1)): computed in the graph
    (smp's FPN and Segformer heads)."""
    report = _export(UpAligned(), torch.randn(2, 2, 5, 7), {0: "B", 2: "H", 3: "W"}, frontend, tmp_path)
    assert report.max_abs_error < 1e-5


class PooledBranch(nn.Module):
    """DeepLabV3+'s ASPP image pooling: a 1×1 map resized back to the input's dynamic size."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pooled = F.adaptive_avg_pool2d(x, 1)
        return x + F.interpolate(pooled, size=x.shape[-2:], mode="bilinear", align_corners=False)


@pytest.mark.parametrize("frontend", ["jit", "fx", "export"])
def test_one_pixel_map_resized_to_a_dynamic_size(frontend: str, tmp_path: Path) -> None:
    report = _export(PooledBranch(), torch.randn(2, 3, 5, 6), {0: "B", 2: "H", 3: "W"}, frontend, tmp_path)
    assert report.max_abs_error < 1e-5

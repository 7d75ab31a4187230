"""torch.ao eager-mode static quantization → NNEF quantized tensors run by tract."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.ao import quantization as tq

import torchlower


class QNet(nn.Module):
    """quant → conv+relu (fused) → conv → add → cat → relu → maxpool → flatten → linear → dequant."""

    def __init__(self) -> None:
        super().__init__()
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.c1, self.r1 = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.skip = torch.ao.nn.quantized.FloatFunctional()
        self.join = torch.ao.nn.quantized.FloatFunctional()
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.r1(self.c1(self.quant(x)))
        b = self.skip.add(a, self.c2(a))
        c = self.relu(self.join.cat([a, b], 1))
        c = torch.flatten(nn.functional.max_pool2d(c, 2), 1)
        return self.dequant(self.fc(c))


class QMLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.l1, self.r1, self.l2 = nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dequant(self.l2(self.r1(self.l1(self.quant(x)))))


def quantized(model: nn.Module, fuse: list[list[str]], per_channel: bool, example: torch.Tensor) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.eval()
        model.qconfig = tq.get_default_qconfig("fbgemm") if per_channel else tq.default_qconfig
        model = tq.fuse_modules(model, fuse)
        tq.prepare(model, inplace=True)
        for _ in range(8):
            model(torch.randn_like(example) * 1.5)
        tq.convert(model, inplace=True)
    return model.eval()


def _out_scale(model: nn.Module, name: str) -> float:
    return float(getattr(model, name).scale)


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
@pytest.mark.parametrize("batch", [1, 3])
def test_quantized_cnn_runs_in_tract(per_channel: bool, batch: int, tmp_path: Path) -> None:
    x = torch.randn(batch, 3, 8, 8)
    model = quantized(QNet(), [["c1", "r1"]], per_channel, x)
    assert (model.fc.weight().qscheme() == torch.per_channel_affine) is per_channel
    step = _out_scale(model, "fc")
    report = torchlower.export(model, x, tmp_path / "q.nnef.tgz", frontend="jit", tolerance=step * 1.01)
    assert report.errors and all(e.ok for e in report.errors)  # within one output quantization step
    art = torchlower.load(report.path)
    assert art.quant is not None and "signed = false" in art.quant
    assert art.weights["c1/weight"].dtype.name == "int8"
    ops = art.graph.op_histogram()
    if per_channel:  # int8 codes, f32 per-channel scales, f32 product, requantized
        assert "c1/weight_scale" in art.weights and "mul" in ops
    else:  # tract's integer conv: i8 weights and i32 bias declared in graph.quant
        assert '"c1_weight"' in art.quant and "bits = 32" in art.quant
        assert art.weights["c1/bias"].dtype.name == "int32"


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_tensor", "per_channel"])
def test_quantized_mlp_runs_in_tract(per_channel: bool, tmp_path: Path) -> None:
    x = torch.randn(5, 32)
    model = quantized(QMLP(), [["l1", "r1"]], per_channel, x)
    report = torchlower.export(model, x, tmp_path / "m.nnef")  # default tolerance: one output step
    assert report.frontend == "jit" and all(e.ok for e in report.errors)
    step = _out_scale(model, "l2")
    scale = max(1.0, float(model(x).abs().max()))
    assert report.errors[0].tolerance == pytest.approx(max(1.01 * step, 1e-4 * scale))
    later = torchlower.check(report.path, inputs=[x.numpy()], model=model)  # same default from the archive
    assert later.errors[0].ok and later.errors[0].tolerance >= step
    assert report.weight_bytes_by_format["int8"] == 32 * 64 + 64 * 8


def test_quantized_op_on_a_float_tensor_is_refused() -> None:
    """A quantized op fed a float tensor is a lowering error, never a silent float computation."""
    from torchlower.nnef.builder import NNEFBuilder
    from torchlower.rules import quantized as rules

    b = NNEFBuilder()
    x = b.add_input("x", torch.float32, (2, 4))
    with pytest.raises(torchlower.errors.LoweringError, match="not a quantized tensor"):
        rules.add(b, x, x, 0.1, 0)
    q = rules.quantize_per_tensor(b, x, 0.1, 3, 13)  # 13: ScalarType quint8, as traces give it
    assert b.quant_params(q).zero_point == 3 and rules.dequantize(b, q) is not q

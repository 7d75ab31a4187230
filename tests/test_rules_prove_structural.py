"""Runtime proofs of registered structural rule keys that only some front end emits.

Each case is written so that one front end (jit ATen names, fx, or torch.export's decomposed
names) calls the key; every case runs through every front end in tract and is compared with
PyTorch, so a wrong rule fails whichever front end reaches it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.ao import quantization as tq

from tests.conftest import Fn, export_and_check, frontend_limit
from torchlower.errors import LoweringError


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _inplace_scatter(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    idx = torch.tensor([[0, 2, 1], [1, 0, 3]])
    y.scatter_(1, idx, x[:, :3] * 2)
    return y


def _scatter_value_(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y.scatter_(1, torch.tensor([[0, 2], [3, 1]]), 1.5)
    return y


def _scatter_reduce_(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y.scatter_(1, torch.tensor([[0, 2], [3, 0]]), x[:, :2], reduce="add")
    return y


def _scatter_value_reduce_(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y.scatter_(1, torch.tensor([[0, 2], [3, 0]]), 2.0, reduce="multiply")
    return y


def _scatter_add_(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y.scatter_add_(1, torch.tensor([[0, 2, 2], [3, 0, 0]]), x[:, :3])
    return y


def _scatter_reduce_two_(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y.scatter_reduce_(1, torch.tensor([[0, 2, 2], [3, 0, 0]]), x[:, :3], "amax", include_self=True)
    return y


def _masked_fill_(x: torch.Tensor) -> torch.Tensor:
    y = x.clone()
    y.masked_fill_(x > 0.3, torch.tensor(-1.0))
    return y


def _detach_(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    y.detach_()
    return y + 1


CASES: dict[str, tuple[Callable[..., object], tuple[torch.Tensor, ...]]] = {
    "concat": (lambda x, y: torch.concat([x, y], 1), (_r(2, 3), _r(2, 4))),
    "concatenate": (lambda x, y: torch.concatenate([x, y], 0), (_r(2, 3), _r(1, 3))),
    "unsafe_split": (lambda x: [t * 2 for t in torch.unsafe_split(x, 2, 1)], (_r(2, 5),)),
    "unsafe_chunk": (lambda x: [t + 1 for t in torch.unsafe_chunk(x, 3, 1)], (_r(2, 6),)),
    "unsafe_split_with_sizes": (
        lambda x: [t - 1 for t in torch.unsafe_split_with_sizes(x, [1, 4], 1)],
        (_r(2, 5),),
    ),
    "numpy_T": (lambda x: x.T * 2, (_r(3, 4),)),
    "to_other": (lambda x, y: x.to(y) + y, (_r(3, 4), _r(3, 4).double())),
    "constant_pad_nd": (lambda x: F.pad(x, (1, 2, 0, 1), value=0.5), (_r(1, 2, 3, 4),)),
    "constant_pad_nd_direct": (lambda x: torch.constant_pad_nd(x, [1, 0, 2, 1], -1.5), (_r(2, 3, 4),)),
    "reflection_pad1d_direct": (lambda x: torch._C._nn.reflection_pad1d(x, [2, 1]), (_r(1, 2, 5),)),
    "reflection_pad2d_direct": (lambda x: torch._C._nn.reflection_pad2d(x, [2, 1, 1, 2]), (_r(1, 2, 4, 5),)),
    "reflection_pad3d_direct": (
        lambda x: torch._C._nn.reflection_pad3d(x, [1, 1, 2, 0, 1, 1]),
        (_r(1, 2, 3, 4, 5),),
    ),
    "replication_pad1d_direct": (lambda x: torch._C._nn.replication_pad1d(x, [2, 1]), (_r(1, 2, 5),)),
    "replication_pad2d_direct": (
        lambda x: torch._C._nn.replication_pad2d(x, [2, 1, 1, 2]),
        (_r(1, 2, 4, 5),),
    ),
    "replication_pad3d_direct": (
        lambda x: torch._C._nn.replication_pad3d(x, [1, 1, 2, 0, 1, 1]),
        (_r(1, 2, 3, 4, 5),),
    ),
    "pad_circular_direct": (lambda x: torch._C._nn._pad_circular(x, [2, 1, 1, 0]), (_r(1, 2, 4, 5),)),
    "nearest_exact3d_direct": (
        lambda x: torch._C._nn._upsample_nearest_exact3d(x, [4, 6, 7], None, None, None),
        (_r(1, 2, 2, 3, 4),),
    ),
    "norm_vf": (lambda x: torch._VF.norm(x) + x, (_r(3, 6),)),
    "norm_vf_p_dtype": (lambda x: torch._VF.norm(x, 3, dtype=torch.float32) + x, (_r(3, 6),)),
    "frobenius_norm_vf": (lambda x: torch._VF.frobenius_norm(x, [0, 1], False), (_r(3, 6),)),
    "embedding_bag_direct": (
        lambda i: torch._embedding_bag(
            torch.arange(20.0).reshape(5, 4) / 7, i, torch.tensor([0, 2]), False, 0
        )[0],
        (torch.tensor([1, 2, 4, 4, 3]),),
    ),
    "to_copy_direct": (lambda x: torch.ops.aten._to_copy(x, dtype=torch.float64) * 2, (_r(3, 4),)),
    "reshape_alias_direct": (lambda x: torch.ops.aten._reshape_alias(x * 2, [4, 3], [3, 1]), (_r(3, 4),)),
    "lift_fresh_direct": (lambda x: torch.ops.aten.lift_fresh(x * 2) + 1, (_r(3, 4),)),
    "detach_direct": (lambda x: torch.ops.aten.detach_(x * 2) + 1, (_r(3, 4),)),
    "native_channel_shuffle": (lambda x: torch.native_channel_shuffle(x, 2), (_r(1, 4, 3, 3),)),
    "bilinear_aa_direct": (
        lambda x: torch._C._nn._upsample_bilinear2d_aa(x, [3, 2], False, None, None),
        (_r(1, 2, 6, 8),),
    ),
    "bicubic_aa_direct": (
        lambda x: torch._C._nn._upsample_bicubic2d_aa(x, [3, 2], False, None, None),
        (_r(1, 2, 6, 8),),
    ),
    "nearest_exact2d_direct": (
        lambda x: torch._C._nn._upsample_nearest_exact2d(x, [6, 7], None, None),
        (_r(1, 2, 3, 4),),
    ),
    "reflection_pad1d": (lambda x: F.pad(x, (2, 1), mode="reflect"), (_r(1, 2, 5),)),
    "reflection_pad2d": (lambda x: F.pad(x, (2, 1, 1, 2), mode="reflect"), (_r(1, 2, 4, 5),)),
    "reflection_pad3d": (lambda x: F.pad(x, (1, 1, 2, 0, 1, 1), mode="reflect"), (_r(1, 2, 3, 4, 5),)),
    "replication_pad1d": (lambda x: F.pad(x, (2, 1), mode="replicate"), (_r(1, 2, 5),)),
    "replication_pad2d": (lambda x: F.pad(x, (2, 1, 1, 2), mode="replicate"), (_r(1, 2, 4, 5),)),
    "replication_pad3d": (lambda x: F.pad(x, (1, 1, 2, 0, 1, 1), mode="replicate"), (_r(1, 2, 3, 4, 5),)),
    "pad_circular": (lambda x: F.pad(x, (2, 1, 1, 0), mode="circular"), (_r(1, 2, 4, 5),)),
    "convolution": (
        lambda x, w: torch.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
        (_r(1, 2, 5, 5), _r(3, 2, 3, 3)),
    ),
    "conv_transpose3d": (nn.ConvTranspose3d(2, 3, 3, stride=2, padding=1), (_r(1, 2, 3, 4, 3),)),
    "native_batch_norm": (
        lambda x: torch.native_batch_norm(
            x,
            torch.ones(3) * 2,
            torch.zeros(3) + 0.5,
            torch.zeros(3) + 0.1,
            torch.ones(3) * 1.5,
            False,
            0.1,
            1e-5,
        )[0],
        (_r(2, 3, 4, 4),),
    ),
    "native_layer_norm": (
        lambda x: torch.native_layer_norm(x, [4], torch.ones(4) * 2, torch.zeros(4) + 0.5, 1e-5)[0],
        (_r(2, 3, 4),),
    ),
    "native_group_norm": (
        lambda x: torch.native_group_norm(x, torch.ones(4) * 2, torch.zeros(4) + 0.5, 2, 4, 9, 2, 1e-5)[0],
        (_r(2, 4, 3, 3),),
    ),
    "softmax": (lambda x: torch._softmax(x, 1, False), (_r(2, 5),)),
    "log_softmax": (lambda x: torch._log_softmax(x, 1, False), (_r(2, 5),)),
    "upsample_bilinear2d": (
        lambda x: torch._C._nn.upsample_bilinear2d(x, [6, 8], False, None, None),
        (_r(1, 2, 3, 4),),
    ),
    "upsample_nearest2d": (
        lambda x: torch._C._nn.upsample_nearest2d(x, [6, 8], None, None),
        (_r(1, 2, 3, 4),),
    ),
    "upsample_bicubic2d": (
        lambda x: torch._C._nn.upsample_bicubic2d(x, [6, 8], False, None, None),
        (_r(1, 2, 3, 4),),
    ),
    "upsample_trilinear3d": (
        lambda x: torch._C._nn.upsample_trilinear3d(x, [4, 6, 8], False, None, None, None),
        (_r(1, 2, 2, 3, 4),),
    ),
    "upsample_nearest3d": (
        lambda x: torch._C._nn.upsample_nearest3d(x, [4, 6, 8], None, None, None),
        (_r(1, 2, 2, 3, 4),),
    ),
    "nearest_exact2d": (lambda x: F.interpolate(x, size=(6, 7), mode="nearest-exact"), (_r(1, 2, 3, 4),)),
    "nearest_exact3d": (
        lambda x: F.interpolate(x, size=(4, 6, 7), mode="nearest-exact"),
        (_r(1, 2, 2, 3, 4),),
    ),
    "bilinear_aa": (
        lambda x: F.interpolate(x, size=(3, 2), mode="bilinear", antialias=True),
        (_r(1, 2, 6, 8),),
    ),
    "bicubic_aa": (
        lambda x: F.interpolate(x, size=(3, 2), mode="bicubic", antialias=True),
        (_r(1, 2, 6, 8),),
    ),
    "scatter_src_": (_inplace_scatter, (_r(2, 5),)),
    "scatter_value_": (_scatter_value_, (_r(2, 5),)),
    "scatter_reduce_": (_scatter_reduce_, (_r(2, 5),)),
    "scatter_value_reduce_": (_scatter_value_reduce_, (_r(2, 5),)),
    "scatter_value_reduce": (
        lambda x: x.scatter(1, torch.tensor([[0, 2], [3, 0]]), 2.0, reduce="add"),
        (_r(2, 5),),
    ),
    "scatter_add_": (_scatter_add_, (_r(2, 5),)),
    "scatter_reduce_two_": (_scatter_reduce_two_, (_r(2, 5),)),
    "masked_fill_tensor_": (_masked_fill_, (_r(3, 4),)),
    "empty_like": (lambda x: torch.empty_like(x).fill_(2.0) + x, (_r(3, 4),)),
    "new_empty": (lambda x: x.new_empty((3, 4)).zero_() + x, (_r(3, 4),)),
    "argsort_stable": (lambda x: torch.argsort(x, dim=1, stable=True), (_r(3, 6),)),
    "var_mean": (lambda x: torch.var_mean(x, 1), (_r(3, 6),)),
    "var_mean_all": (lambda x: torch.var_mean(x), (_r(3, 6),)),
    "var_mean_correction": (lambda x: torch.var_mean(x, 1, correction=0, keepdim=True), (_r(3, 6),)),
    "std_mean": (lambda x: torch.std_mean(x, [0, 1]), (_r(3, 6),)),
    "norm_scalar": (lambda x: torch.norm(x) + x, (_r(3, 6),)),
    "norm_p3": (lambda x: torch.norm(x, 3) + x, (_r(3, 6),)),
    "norm_dim_dtype": (lambda x: torch.norm(x, 2, dim=1, dtype=torch.float32), (_r(3, 6),)),
    "frobenius_norm_dim": (lambda x: torch.norm(x, "fro", dim=(0, 1)), (_r(3, 6),)),
    "embedding_bag": (
        lambda i: F.embedding_bag(i, torch.arange(20.0).reshape(5, 4) / 7, torch.tensor([0, 2]), mode="mean"),
        (torch.tensor([1, 2, 4, 4, 3]),),
    ),
    "detach_": (_detach_, (_r(3, 4),)),
    "feature_alpha_dropout": (lambda x: F.feature_alpha_dropout(x, 0.5, False) * 2, (_r(2, 3, 4),)),
    # the in-place dropouts reach their rules under jit (fx and export see the functional forms)
    "alpha_dropout_": (lambda x: F.alpha_dropout(x * 1, 0.5, False, inplace=True) + 1, (_r(2, 3),)),
    "feature_alpha_dropout_": (
        lambda x: F.feature_alpha_dropout(x * 1, 0.5, False, inplace=True) + 1,
        (_r(2, 3, 4),),
    ),
    "feature_dropout_": (lambda x: torch.feature_dropout_(x * 1, 0.5, False) + 1, (_r(2, 3, 4),)),
    "resolve_neg": (lambda x: torch.resolve_neg(x) * 2 + x.resolve_neg(), (_r(3, 4),)),
}


class SymbolicAranges(nn.Module):
    """``arange(1, S + 1)`` and ``arange(1, 2S + 1, 2)`` over a dynamic S (static ones are folded)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        return x + torch.arange(1, n + 1) + torch.arange(1, 2 * n + 1, 2)


def test_arange_with_symbolic_bounds(tmp_path, frontend) -> None:
    """tract sizes ``range(1, 2S + 1, 2)`` as ``(2S + 1) / 2``, which it cannot equate with S."""
    import torchlower

    report = torchlower.export(
        SymbolicAranges(), (_r(3, 4),), tmp_path / "m.nnef.tgz", frontend=frontend,
        dynamic_axes={"x": {1: "S"}},
    )  # fmt: skip
    assert {"aten::arange.start", "aten::arange.start_step"} <= set(report.rules_used)
    # exact on any CPU: the same two elementwise float adds (correctly rounded) in the same order
    assert len(report.points) > 4 and all(e.ok and e.max_abs == 0.0 for e in report.errors)


@pytest.mark.parametrize("case", sorted(CASES))
def test_structural_key(case: str, tmp_path, frontend, request: pytest.FixtureRequest) -> None:
    fn, args = CASES[case]
    if case == "numpy_T":
        frontend_limit(request, frontend, "fx", LoweringError, "fx cannot lower the attribute Tensor.T")
    model = fn if isinstance(fn, nn.Module) else Fn(fn)
    export_and_check(model, args, tmp_path, frontend)


class LSTMCellNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(4, 5)

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cell(x, (h, c))


CELLS = {
    "lstm": (LSTMCellNet(), (_r(3, 4), _r(3, 5), _r(3, 5))),
    "gru": (nn.GRUCell(4, 5), (_r(3, 4), _r(3, 5))),
    "rnn_tanh": (nn.RNNCell(4, 5), (_r(3, 4), _r(3, 5))),
    "rnn_relu": (nn.RNNCell(4, 5, nonlinearity="relu"), (_r(3, 4), _r(3, 5))),
}


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_rnn_cell(cell: str, tmp_path, frontend) -> None:
    module, args = CELLS[cell]
    export_and_check(module, args, tmp_path, frontend)


class QAddReluMul(nn.Module):
    """torch.ao eager quantization: quantized::add_relu, quantized::mul, then dequantize."""

    def __init__(self) -> None:
        super().__init__()
        self.quant, self.quant2, self.dequant = tq.QuantStub(), tq.QuantStub(), tq.DeQuantStub()
        self.add_relu = torch.ao.nn.quantized.FloatFunctional()
        self.mul = torch.ao.nn.quantized.FloatFunctional()

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a, c = self.quant(x), self.quant2(y)
        return self.dequant(self.mul.mul(self.add_relu.add_relu(a, c), c))


def test_quantized_add_relu_mul(tmp_path) -> None:
    x, y = _r(2, 8), _r(2, 8)
    model = QAddReluMul().eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.qconfig = tq.default_qconfig
        tq.prepare(model, inplace=True)
        for _ in range(8):
            model(torch.randn_like(x) * 1.5, torch.randn_like(y) * 1.5)
        tq.convert(model, inplace=True)
    step = float(model.mul.scale)
    report = export_and_check(model, (x, y), tmp_path, "jit", tolerance=step * 1.01)
    assert {"quantized::add_relu", "quantized::mul"} <= set(report.rules_used)

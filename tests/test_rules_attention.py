from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import torchlower
from tests.conftest import export_and_check
from tests.test_rules_recurrent import check_module_rule


class Sdpa(nn.Module):
    def __init__(self, is_causal: bool = False, scale: float | None = None, gqa: bool = False) -> None:
        super().__init__()
        self.is_causal, self.scale, self.gqa = is_causal, scale, gqa

    def forward(self, q, k, v, mask=None):
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=self.is_causal, scale=self.scale, enable_gqa=self.gqa
        )


def attentions(report) -> int:
    """Softmaxes, counting those tract's fused SDPA took over at short lengths (nnef/fusions.py)
    and those written as exp(x - max_pool) / sum (nnef/rows.py; one exp each, these models have
    no other)."""
    ops = report.op_histogram
    return ops["softmax"] + ops["tract_transformers_sdpa"] + ops["exp"]


def qkv(*lead: int, length: int = 5, source: int = 7, dim: int = 8) -> tuple[torch.Tensor, ...]:
    return torch.randn(*lead, length, dim), torch.randn(*lead, source, dim), torch.randn(*lead, source, dim)


@pytest.mark.parametrize("lead", [(), (3,), (2, 3)])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_sdpa(tmp_path, frontend, lead, scale):
    report = export_and_check(Sdpa(scale=scale), qkv(*lead), tmp_path, frontend)
    assert attentions(report) == 1


@pytest.mark.parametrize("source", [5, 7])
def test_sdpa_causal(tmp_path, frontend, source):
    export_and_check(Sdpa(is_causal=True), qkv(2, 3, source=source), tmp_path, frontend)


@pytest.mark.parametrize("mask_shape", [(5, 7), (2, 1, 5, 7), (2, 3, 5, 7), (1, 7)])
def test_sdpa_bool_mask(tmp_path, frontend, mask_shape):
    mask = torch.rand(mask_shape) > 0.4
    mask[..., 0] = True  # no fully masked row (PyTorch gives NaN there)
    export_and_check(Sdpa(), (*qkv(2, 3), mask), tmp_path, frontend)


@pytest.mark.parametrize("mask_shape", [(5, 7), (2, 3, 5, 7)])
def test_sdpa_float_mask(tmp_path, frontend, mask_shape):
    export_and_check(Sdpa(), (*qkv(2, 3), torch.randn(mask_shape)), tmp_path, frontend)


def test_sdpa_gqa(tmp_path, frontend):
    q = torch.randn(2, 6, 5, 8)
    k, v = torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    export_and_check(Sdpa(gqa=True), (q, k, v), tmp_path, frontend)


class ConstMaskAttention(nn.Module):
    """MultiheadAttention with masks held as buffers (their conversion folds at export time)."""

    def __init__(self, need_weights: bool, average: bool, padding: bool, attn: bool) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)
        self.need_weights, self.average = need_weights, average
        pad = torch.tensor([[False, False, False, True], [False, True, False, False]])
        self.register_buffer("pad", pad if padding else None)
        self.register_buffer("attn", torch.ones(4, 4, dtype=torch.bool).triu(1) if attn else None)

    def forward(self, x):
        out, weights = self.mha(
            x, x, x, key_padding_mask=self.pad, attn_mask=self.attn,
            need_weights=self.need_weights, average_attn_weights=self.average,
        )  # fmt: skip
        return (out, weights) if self.need_weights else out


@pytest.mark.parametrize(("padding", "attn"), [(False, False), (True, False), (False, True), (True, True)])
@pytest.mark.parametrize(("need_weights", "average"), [(False, True), (True, True), (True, False)])
def test_native_multi_head_attention(tmp_path, frontend, padding, attn, need_weights, average):
    """Without gradients MultiheadAttention takes its fused fast path: aten::_native_multi_head_attention."""
    model = ConstMaskAttention(need_weights, average, padding, attn).requires_grad_(False)
    report = export_and_check(model, torch.randn(2, 4, 8), tmp_path, frontend)
    assert attentions(report) == 1


class InputMaskAttention(nn.Module):
    """MultiheadAttention on the slow (decomposed) path, masks as graph inputs."""

    def __init__(self, batch_first: bool, need_weights: bool, average: bool) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2, batch_first=batch_first)
        self.need_weights, self.average = need_weights, average

    def forward(self, q, k, v, pad, attn):
        out, weights = self.mha(
            q, k, v, key_padding_mask=pad, attn_mask=attn,
            need_weights=self.need_weights, average_attn_weights=self.average,
        )  # fmt: skip
        return (out, weights) if self.need_weights else out


def mha_inputs(batch_first: bool, bool_masks: bool) -> tuple[torch.Tensor, ...]:
    q, k, v = torch.randn(2, 4, 8), torch.randn(2, 6, 8), torch.randn(2, 6, 8)
    if not batch_first:
        q, k, v = (t.transpose(0, 1).contiguous() for t in (q, k, v))
    pad = torch.tensor([[False] * 5 + [True], [False, True] + [False] * 4])
    attn = torch.rand(4, 6) > 0.7
    attn[:, 0] = False
    if not bool_masks:
        pad, attn = pad.float() * -1e4, torch.randn(4, 6)
    return q, k, v, pad, attn


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize(("need_weights", "average"), [(False, True), (True, True), (True, False)])
@pytest.mark.parametrize("bool_masks", [False, True])
def test_multihead_attention(tmp_path, frontend, batch_first, need_weights, average, bool_masks):
    model = InputMaskAttention(batch_first, need_weights, average)
    export_and_check(model, mha_inputs(batch_first, bool_masks), tmp_path, frontend)


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize(("need_weights", "average"), [(False, True), (True, True), (True, False)])
@pytest.mark.parametrize("bool_masks", [False, True])
def test_multihead_attention_module_rule(tmp_path, batch_first, need_weights, average, bool_masks):
    model = nn.MultiheadAttention(8, 2, batch_first=batch_first)
    q, k, v, pad, attn = mha_inputs(batch_first, bool_masks)
    check_module_rule(tmp_path, model, [q, k, v, pad, need_weights, attn, average])


class EncoderStack(nn.Module):
    def __init__(self, norm_first: bool, activation: str, padding: bool) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(
            8, 2, 16, batch_first=True, norm_first=norm_first, activation=activation
        )
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        pad = torch.tensor([[False] * 4 + [True], [False] * 5])
        self.register_buffer("pad", pad if padding else None)

    def forward(self, x):
        return self.encoder(x, src_key_padding_mask=self.pad)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("padding", [False, True])
def test_transformer_encoder_fast_path(tmp_path, frontend, norm_first, activation, padding):
    """Frozen encoder layers run fused: aten::_transformer_encoder_layer_fwd."""
    model = EncoderStack(norm_first, activation, padding).requires_grad_(False)
    report = export_and_check(model, torch.randn(2, 5, 8), tmp_path, frontend)
    assert attentions(report) == 2


class MaskedSdpa(nn.Module):
    def forward(self, q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("kind", ["bool", "-inf"])
def test_sdpa_row_that_attends_to_nothing_is_zero(tmp_path, frontend, kind):
    """torch's SDPA gives 0 on a fully masked query row; the finite fill alone gave the mean of v."""
    q, k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4)
    keep = torch.ones(3, 5, dtype=torch.bool)
    keep[1] = False
    mask = keep if kind == "bool" else torch.zeros(3, 5).masked_fill(~keep, float("-inf"))
    expected = MaskedSdpa()(q, k, v, mask)
    assert bool((expected[:, :, 1] == 0).all()) and bool(expected[:, :, 0].abs().sum() > 0)
    export_and_check(MaskedSdpa(), (q, k, v, mask), tmp_path, frontend)
    out = torchlower.load(tmp_path / "model.nnef.tgz").run([t.numpy() for t in (q, k, v, mask)])
    got = next(iter(out.values()))
    assert abs(got - expected.numpy()).max() < 1e-5

"""Fusions (torchlower/nnef/fusions.py): each fires where it should, keeps the numbers, and stays
away from the shapes and masks where tract's fused kernel would compute something else.

Every model is exported with the fusions and without them (``fusions.apply`` switched off); both
artifacts run in tract and must match PyTorch, on the example and on fresh inputs.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlower
from torchlower.nnef import fusions
from torchlower.nnef.tract import run_in_tract


def _both(monkeypatch, tmp_path, model, x, frontend="jit"):
    """(report without fusions, report with fusions); both checked against PyTorch in tract."""
    model = model.eval()
    with monkeypatch.context() as m:
        m.setattr(fusions, "apply", lambda b: False)
        plain = torchlower.export(model, x, tmp_path / "plain.nnef.tar", frontend=frontend)
    fused = torchlower.export(model, x, tmp_path / "fused.nnef.tar", frontend=frontend)
    for report in (plain, fused):
        assert report.errors and all(e.ok for e in report.errors), report.errors
    for seed in (1, 2):  # not only the example input
        fresh = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed))
        with torch.no_grad():
            want = model(fresh).numpy()
        for report in (plain, fused):
            got = run_in_tract(report.path, [fresh.numpy()])[0]
            assert abs(got - want).max() <= 1e-5 * max(1.0, float(abs(want).max()))
    return plain, fused


def _softmaxes(report) -> int:
    """Softmaxes left in the graph, as tract's op or as the max_pool form (nnef/rows.py)."""
    return report.op_histogram["softmax"] + report.op_histogram["max_pool"]


class Causal(nn.Module):
    """Hand-written attention: q·kᵀ / √d, a masked_fill causal mask, softmax, · v."""

    def __init__(self, dim: int = 32, heads: int = 4, fill: float = float("-inf")) -> None:
        super().__init__()
        self.heads, self.fill, self.qkv = heads, fill, nn.Linear(dim, 3 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
        return (att.masked_fill(mask, self.fill).softmax(-1) @ v).transpose(1, 2).reshape(b, s, d)


def test_transformer_encoder_attention_becomes_sdpa(monkeypatch, tmp_path, frontend):
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    plain, fused = _both(monkeypatch, tmp_path, layer, torch.randn(2, 12, 32), frontend)
    assert plain.op_histogram["tract_transformers_sdpa"] == 0 and plain.op_histogram["softmax"] == 1
    assert fused.op_histogram["tract_transformers_sdpa"] == 1 and fused.op_histogram["softmax"] == 0


@pytest.mark.parametrize("fill", [float("-inf"), -1e9])
def test_masked_fill_causal_mask_becomes_an_additive_mask(monkeypatch, tmp_path, fill):
    plain, fused = _both(monkeypatch, tmp_path, Causal(fill=fill), torch.randn(1, 10, 32))
    assert fused.op_histogram["tract_transformers_sdpa"] == 1 and fused.op_histogram["select"] == 0
    assert plain.op_histogram["select"] == 1


class FloatMask(nn.Module):
    def __init__(self, mask: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("mask", mask)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = x, x * 0.5, x.flip(-1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)


def test_sdpa_with_float_mask_and_inf(monkeypatch, tmp_path):
    mask = torch.randn(1, 1, 8, 8)
    mask[..., 3] = float("-inf")  # a key nobody attends to: -inf becomes the lowest finite float
    _, fused = _both(monkeypatch, tmp_path, FloatMask(mask), torch.randn(2, 3, 8, 16))
    assert fused.op_histogram["tract_transformers_sdpa"] == 1


def test_row_without_keys_is_not_fused(monkeypatch, tmp_path):
    """tract's kernel returns 0 for a row that attends nothing; the chain (like torch with a
    finite fill) returns a uniform average there, so such a mask keeps the chain."""
    mask = torch.zeros(1, 1, 8, 8)
    mask[..., 2, :] = -1e30
    _, fused = _both(monkeypatch, tmp_path, FloatMask(mask), torch.randn(1, 2, 8, 16))
    assert fused.op_histogram["tract_transformers_sdpa"] == 0 and _softmaxes(fused) == 1


def test_long_sequences_keep_matmul_and_softmax(monkeypatch, tmp_path):
    """Beyond 64×64 even a causal mask (whose masked tiles tract's kernel skips) leaves the
    flash kernel slower than tract's matmuls: the chain stays."""
    _, fused = _both(monkeypatch, tmp_path, Causal(), torch.randn(1, 72, 32))
    assert fused.op_histogram["tract_transformers_sdpa"] == 0 and _softmaxes(fused) == 1


def test_flash_length_depends_on_skipped_tiles(monkeypatch, tmp_path):
    """At 48×48 the causal mask fuses (a whole 32×32 tile is skipped), no mask does not."""
    _, causal = _both(monkeypatch, tmp_path, Causal(), torch.randn(1, 48, 32))
    _, dense = _both(monkeypatch, tmp_path, FloatMask(torch.zeros(1, 1, 48, 48)), torch.randn(1, 2, 48, 16))
    assert causal.op_histogram["tract_transformers_sdpa"] == 1
    assert dense.op_histogram["tract_transformers_sdpa"] == 0


def test_weights_used_twice_are_not_fused(monkeypatch, tmp_path):
    """need_weights=True: the attention weights are an output, so the chain must stay."""

    class Both(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            out, weights = self.mha(x, x, x, need_weights=True, average_attn_weights=False)
            return out, weights

    model, x = Both().eval(), torch.randn(1, 6, 16)
    report = torchlower.export(model, x, tmp_path / "m.nnef.tar", frontend="jit")
    assert report.errors and all(e.ok for e in report.errors)
    assert report.op_histogram["tract_transformers_sdpa"] == 0


def test_f16_export_is_left_alone(tmp_path):
    layer = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True).eval()
    report = torchlower.export(layer, torch.randn(1, 8, 32), tmp_path / "m.nnef.tar", precision="f16")
    assert report.op_histogram["tract_transformers_sdpa"] == 0


class RaggedSoftmax(nn.Module):
    """Softmax rows of 70 into a matmul (padded to 128) and of 40 into an add (max_pool form)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = x @ x.transpose(-2, -1)
        return scores.softmax(-1) @ x + (x * 3.0).softmax(-1)


def test_ragged_softmax_rows_are_padded(monkeypatch, tmp_path):
    """Long rows padded with -inf weights (v padded instead of the weights sliced), short rows
    as exp(x - max_pool) / sum: same numbers as tract's softmax."""
    plain, fused = _both(monkeypatch, tmp_path, RaggedSoftmax(), torch.randn(1, 70, 40))  # 70² > flash
    assert plain.op_histogram["pad"] == 0 and plain.op_histogram["softmax"] == 2
    assert fused.op_histogram["pad"] == 2 and fused.op_histogram["slice"] == 0
    assert fused.op_histogram["softmax"] == 1 and fused.op_histogram["max_pool"] == 1


def test_padded_rows_keep_inf_and_lowest_rows(tmp_path):
    """A row of -inf stays NaN and a row of finfo.min stays uniform, as in PyTorch (a finite pad
    value would tie with finfo.min and change that row)."""

    class Plain(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.softmax(-1)

    x = torch.randn(3, 70)
    x[1] = float("-inf")
    x[2] = torch.finfo(torch.float32).min
    report = torchlower.export(Plain(), x, tmp_path / "p.nnef.tar", check=False)  # NaN is the answer
    assert report.op_histogram["pad"] == 1
    got = run_in_tract(report.path, [x.numpy()])[0]
    want = Plain()(x).numpy()
    assert (torch.isnan(torch.from_numpy(got)) == torch.isnan(torch.from_numpy(want))).all()
    finite = ~torch.isnan(torch.from_numpy(want))
    assert abs(got[finite.numpy()] - want[finite.numpy()]).max() <= 1e-6
    assert abs(got[2] - 1 / 70).max() <= 1e-7


@pytest.mark.parametrize("shape", [(3, 20), (2, 3, 20), (2, 2, 2, 2, 2, 20)])
def test_short_softmax_and_amax_by_pool_keep_special_values(monkeypatch, tmp_path, shape):
    """Rows of -inf, NaN, +inf and finfo.min: the max_pool softmax gives PyTorch's values, and
    the pooled amax gives exactly what tract's max_reduce gave (at rank 2 and 6 via a reshape)."""

    class Rows(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x.softmax(-1), x.amax(-1)

    x = torch.randn(shape).reshape(-1, 20)
    x[0], x[1, 3], x[2, 5] = float("-inf"), float("nan"), float("inf")
    x = x.reshape(shape)
    with monkeypatch.context() as m:
        m.setattr(fusions, "apply", lambda b: False)
        plain = torchlower.export(Rows(), x, tmp_path / "plain.nnef.tar", check=False)
    pooled = torchlower.export(Rows(), x, tmp_path / "pooled.nnef.tar", check=False)
    assert pooled.op_histogram["max_reduce"] == 0 and pooled.op_histogram["softmax"] == 0
    soft_plain, max_plain = run_in_tract(plain.path, [x.numpy()])
    soft, amax = run_in_tract(pooled.path, [x.numpy()])
    want = torch.from_numpy(x.numpy()).softmax(-1)
    got = torch.from_numpy(soft)
    assert torch.equal(got.isnan(), want.isnan())
    assert torch.equal(torch.from_numpy(soft_plain).isnan(), want.isnan())
    assert (got - want).nan_to_num().abs().max() <= 1e-6
    # exact by construction: a max returns one of its operands, however the pool orders them
    assert torch.equal(torch.from_numpy(amax).nan_to_num(), torch.from_numpy(max_plain).nan_to_num())


class CrossStep(nn.Module):
    """A decoder step's cross-attention: new queries (symbolic S) over precomputed keys/values
    (graph inputs), or over keys that are weights (``const_keys``)."""

    def __init__(self, const_keys: torch.Tensor | None = None) -> None:
        super().__init__()
        self.keys = None if const_keys is None else nn.Parameter(const_keys, requires_grad=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        k = k if self.keys is None else self.keys
        return torch.matmul(torch.softmax(torch.matmul(q * 0.25, k.transpose(2, 3)), -1), v)


@pytest.mark.parametrize(
    ("keys", "const", "fuses"), [(256, False, True), (128, False, False), (256, True, False)]
)
def test_decode_step_cross_attention_becomes_sdpa(tmp_path, keys, const, fuses):
    """A symbolic query length over ≥ MIN_DECODE_KEYS computed keys fuses (tract packs a
    non-constant matmul operand on every call; flash reads it once); fewer keys, or keys that
    are weights (packed once at load), keep the chain. Checked at S = 1 and S = 3."""
    g = torch.Generator().manual_seed(0)
    k, v = (torch.randn(1, 2, keys, 16, generator=g) for _ in range(2))
    model = CrossStep(k.clone() if const else None).eval()
    example = (torch.randn(1, 2, 3, 16, generator=g), k, v)
    report = torchlower.export(
        model, example, tmp_path / "m.nnef.tar", input_names=["q", "k", "v"], dynamic_axes={"q": {2: "S"}}
    )
    assert report.errors and all(e.ok for e in report.errors), report.errors
    assert report.op_histogram["tract_transformers_sdpa"] == int(fuses)
    for s in (1, 3):
        q = torch.randn(1, 2, s, 16, generator=g)
        with torch.no_grad():
            want = model(q, k, v).numpy()
        got = run_in_tract(report.path, [q.numpy(), k.numpy(), v.numpy()])[0]
        assert abs(got - want).max() <= 1e-5

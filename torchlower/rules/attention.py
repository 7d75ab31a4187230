"""Attention: scaled_dot_product_attention and multi-head attention.

Written as plain ``matmul`` / ``softmax`` ops (tract fuses them itself), with every mask turned
into an additive float mask: tract's fused SDPA rejects boolean masks, and an additive mask also
composes with ``is_causal`` and key-padding masks by a single ``add``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from torchlower.core.values import Shape, Value, constant
from torchlower.errors import LoweringError
from torchlower.rules import module_rule, rule
from torchlower.rules.attention_f16 import attend_f16
from torchlower.rules.attention_f16 import to as _to
from torchlower.rules.common import Builder, align_ranks, reshape, shape_of, unsqueeze_to

NEG_INF = float("-inf")  # printed as the lowest finite f32: exp() still gives exactly 0


def additive_mask(b: Builder, mask: Value, dtype: torch.dtype) -> Value:
    """A boolean mask (True = attend) as 0 / -inf; float masks are already additive."""
    if mask.dtype != torch.bool:
        return mask
    if mask.is_const:
        return constant(torch.zeros(mask.const.shape, dtype=dtype).masked_fill(~mask.const, NEG_INF))
    return b.call("select", [mask, 0.0, NEG_INF], dtype=dtype, shape=mask.shape)


def attend(
    b: Builder,
    q: Value,
    k: Value,
    v: Value,
    mask: Value | None,
    scale: float,
    is_causal: bool,
    empty_rows_zero: bool = False,
) -> tuple[Value, Value]:
    """softmax(q kᵀ · scale + mask) v over the last two axes; returns (output, weights).

    ``empty_rows_zero``: a query row whose mask attends to nothing gives 0, as torch's
    scaled_dot_product_attention does (its explicit softmax gives NaN there; our finite fill
    would give the plain average of ``v``)."""
    q, k, v = align_ranks(b, q, k, v)
    qs, ks, vs = shape_of(q), shape_of(k), shape_of(v)
    length, source = qs[-2], ks[-2]
    score_shape: Shape = (*qs[:-1], source)
    half = q.dtype == torch.float16
    if half:  # torch's CPU kernel: scores, mask and softmax statistics in f32 (see attention_f16)
        q, k, v = (_to(b, t, torch.float32) for t in (q, k, v))
        mask = _to(b, mask, torch.float32) if mask is not None and mask.dtype == torch.float16 else mask
    scores = b.call("matmul", [q, k], {"transposeA": False, "transposeB": True}, dtype=q.dtype)
    scores = b.call("mul", [scores, float(scale)], dtype=q.dtype, shape=score_shape)
    if is_causal:
        if not isinstance(length, int) or not isinstance(source, int):
            raise LoweringError("is_causal=True needs static query/key lengths")
        causal = torch.ones(length, source, dtype=torch.bool).tril()
        mask = _combine(b, mask, constant(causal), q.dtype or torch.float32)
    if mask is not None:
        mask = additive_mask(b, mask, q.dtype or torch.float32)
        scores, mask = align_ranks(b, scores, mask)
        scores = b.call("add", [scores, mask], dtype=q.dtype, shape=score_shape)
    if half:
        return attend_f16(b, scores, v, (*qs[:-1], vs[-1]))
    weights = b.call("softmax", [scores], {"axes": [len(score_shape) - 1]}, dtype=q.dtype, shape=score_shape)
    out_shape = (*qs[:-1], vs[-1])
    out = b.call("matmul", [weights, v], {"transposeA": False, "transposeB": False}, dtype=q.dtype)
    out = out.with_meta(q.dtype, out_shape)
    if empty_rows_zero and mask is not None:
        out = _zero_empty_rows(b, out, mask)
    return out, weights


def _zero_empty_rows(b: Builder, out: Value, mask: Value) -> Value:
    """``out`` with 0 on the rows where the additive ``mask`` is -inf (or its finite stand-in,
    the lowest float) at every key."""
    lowest = torch.finfo(mask.dtype or torch.float32).min
    if mask.is_const:
        alive = mask.const.amax(-1, keepdim=True) > lowest
        if bool(alive.all()):
            return out
        alive_value = constant(alive)
    else:
        row_shape = (*shape_of(mask)[:-1], 1)
        top = b.call("max_reduce", [mask], {"axes": [mask.rank - 1]}, dtype=mask.dtype, shape=row_shape)
        alive_value = b.call("gt", [top, lowest], dtype=torch.bool, shape=row_shape)
    alive_value, out = align_ranks(b, alive_value, out)
    return b.call("select", [alive_value, out, 0.0], dtype=out.dtype, shape=out.shape)


def _combine(b: Builder, mask: Value | None, causal: Value, dtype: torch.dtype) -> Value:
    if mask is None:
        return causal
    return add_masks(b, additive_mask(b, mask, dtype), additive_mask(b, causal, dtype))


def add_masks(b: Builder, x: Value, y: Value) -> Value:
    """Sum of two additive masks, broadcast (right-aligned, as PyTorch)."""
    x, y = align_ranks(b, x, y)
    shape = tuple(d if e == 1 else e for d, e in zip(shape_of(x), shape_of(y), strict=True))
    return b.call("add", [x, y], dtype=x.dtype, shape=shape)


@rule("aten::scaled_dot_product_attention")
def scaled_dot_product_attention(
    b: Builder,
    query: Value,
    key: Value,
    value: Value,
    attn_mask: Value | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Value:
    """scaled_dot_product_attention(Tensor query, Tensor key, Tensor value, Tensor? attn_mask=None,
    float dropout_p=0.0, bool is_causal=False, *, float? scale=None, bool enable_gqa=False) -> Tensor"""
    if dropout_p:
        raise LoweringError(
            f"scaled_dot_product_attention: dropout_p must be 0 at inference, got {dropout_p}"
        )
    if enable_gqa:
        key, value = _repeat_heads(b, key, query), _repeat_heads(b, value, query)
    if scale is None:
        scale = 1.0 / math.sqrt(int(shape_of(query)[-1]))
    return attend(b, query, key, value, attn_mask, scale, is_causal, empty_rows_zero=True)[0]


def _repeat_heads(b: Builder, kv: Value, query: Value) -> Value:
    """Grouped-query attention: each key/value head serves ``Hq / Hkv`` consecutive query heads."""
    heads, kv_heads = shape_of(query)[-3], shape_of(kv)[-3]
    if heads == kv_heads:
        return kv
    if kv.rank != 4 or not isinstance(heads, int) or not isinstance(kv_heads, int) or heads % kv_heads:
        raise LoweringError(f"enable_gqa: cannot share {kv_heads} key/value heads among {heads} query heads")
    n, _, s, e = shape_of(kv)
    grown = b.call("unsqueeze", [kv], {"axes": [2]}, dtype=kv.dtype, shape=(n, kv_heads, 1, s, e))
    tiled = b.call("tile", [grown], {"repeats": [1, 1, heads // kv_heads, 1, 1]}, dtype=kv.dtype)
    return b.call("reshape", [tiled], {"shape": [0, heads, s, e]}, dtype=kv.dtype, shape=(n, heads, s, e))


def multi_head(
    b: Builder,
    q: Value,
    k: Value,
    v: Value,
    heads: int,
    proj: tuple[Value, Value, Value],
    bias: Value | None,
    out_w: Value,
    out_b: Value | None,
    mask: Value | None,
    empty_rows_zero: bool = False,
) -> tuple[Value, Value]:
    """Batch-first multi-head attention with an additive ``mask`` broadcastable to (B, H, L, S).

    Returns the projected output (B, L, E) and the per-head weights (B, H, L, S).
    """
    (batch, length, embed), source = shape_of(q), shape_of(k)[1]
    biases = _split(bias, 3) if bias is not None else (None, None, None)
    qh, kh, vh = (
        _heads(b, _linear(b, x, w, bb), heads) for x, w, bb in zip((q, k, v), proj, biases, strict=True)
    )
    dim = int(embed) // heads
    out, weights = attend(b, qh, kh, vh, mask, 1.0 / math.sqrt(dim), False, empty_rows_zero)
    merged = b.call(
        "transpose", [out], {"axes": [0, 2, 1, 3]}, dtype=q.dtype, shape=(batch, length, heads, dim)
    )
    merged = b.call("reshape", [merged], {"shape": [0, 0, -1]}, dtype=q.dtype, shape=(batch, length, embed))
    return _linear(b, merged, out_w, out_b), weights.with_meta(q.dtype, (batch, heads, length, source))


def _split(w: Value, parts: int) -> tuple[Value, ...]:
    return tuple(constant(c, label=w.label) for c in w.const.chunk(parts)) if w.is_const else (w,) * parts


def _linear(b: Builder, x: Value, w: Value, bias: Value | None) -> Value:
    shape = (*shape_of(x)[:-1], shape_of(w)[0])
    y = b.call(
        "matmul", [x, unsqueeze_to(b, w, x.rank)], {"transposeA": False, "transposeB": True}, dtype=x.dtype
    )
    y = y.with_meta(x.dtype, shape)
    if bias is None:
        return y
    return b.call("add", [y, unsqueeze_to(b, bias, x.rank)], dtype=x.dtype, shape=shape)


def _heads(b: Builder, x: Value, heads: int) -> Value:
    """(B, L, E) → (B, H, L, E/H)."""
    batch, length, embed = shape_of(x)
    split = b.call("reshape", [x], {"shape": [0, 0, heads, -1]}, dtype=x.dtype)
    shape = (batch, heads, length, int(embed) // heads)
    return b.call("transpose", [split], {"axes": [0, 2, 1, 3]}, dtype=x.dtype, shape=shape)


def _head_weights(b: Builder, weights: Value, need: bool, average: bool) -> Value | None:
    if not need:
        return None
    if not average:
        return weights
    batch, _, length, source = shape_of(weights)
    mean = b.call(
        "mean_reduce", [weights], {"axes": [1]}, dtype=weights.dtype, shape=(batch, 1, length, source)
    )
    return b.call("squeeze", [mean], {"axes": [1]}, dtype=weights.dtype, shape=(batch, length, source))


def _padding_mask(b: Builder, key_padding_mask: Value, dtype: torch.dtype) -> Value:
    """(B, S) with True = ignore → additive (B, 1, 1, S)."""
    if key_padding_mask.dtype == torch.bool:
        if key_padding_mask.is_const:
            key_padding_mask = constant(~key_padding_mask.const)
        else:
            key_padding_mask = b.call(
                "not", [key_padding_mask], dtype=torch.bool, shape=key_padding_mask.shape
            )
    mask = additive_mask(b, key_padding_mask, dtype)
    batch, source = shape_of(mask)
    return (
        reshape(b, mask, [batch, 1, 1, source])
        if mask.is_const
        else b.call("unsqueeze", [mask], {"axes": [1, 2]}, dtype=dtype, shape=(batch, 1, 1, source))
    )


def _attn_mask(b: Builder, attn_mask: Value, heads: int, dtype: torch.dtype) -> Value:
    """(L, S) or (B·H, L, S) with True = ignore → additive, broadcastable to (B, H, L, S)."""
    if attn_mask.dtype == torch.bool:
        inverted = (
            constant(~attn_mask.const)
            if attn_mask.is_const
            else b.call("not", [attn_mask], dtype=torch.bool, shape=attn_mask.shape)
        )
        attn_mask = additive_mask(b, inverted, dtype)
    if attn_mask.rank == 3:
        _, length, source = shape_of(attn_mask)
        return reshape(b, attn_mask, [-1, heads, length, source])
    return attn_mask


@rule("aten::_native_multi_head_attention")
def native_multi_head_attention(
    b: Builder,
    query: Value,
    key: Value,
    value: Value,
    embed_dim: int,
    num_head: int,
    qkv_weight: Value,
    qkv_bias: Value | None,
    proj_weight: Value,
    proj_bias: Value | None,
    mask: Value | None,
    need_weights: bool,
    average_attn_weights: bool,
    mask_type: int | None,
) -> tuple[Value, Value | None]:
    """_native_multi_head_attention(Tensor query, Tensor key, Tensor value, int embed_dim, int num_head,
    Tensor qkv_weight, Tensor qkv_bias, Tensor proj_weight, Tensor proj_bias, Tensor? mask=None,
    bool need_weights=True, bool average_attn_weights=True, int? mask_type=None) -> (Tensor, Tensor)"""
    dtype = query.dtype or torch.float32
    if mask is not None:
        # MHA's fast path: type 1 is a (B, S) key padding mask, otherwise broadcastable to (B, H, L, S)
        mask = _padding_mask(b, mask, dtype) if mask_type == 1 else _attn_mask(b, mask, num_head, dtype)
    if not qkv_weight.is_const:
        raise LoweringError("_native_multi_head_attention: qkv_weight must be a constant (model weight)")
    proj = _split(qkv_weight, 3)
    out, weights = multi_head(b, query, key, value, num_head, proj, qkv_bias, proj_weight, proj_bias, mask)
    return out, _head_weights(b, weights, need_weights, average_attn_weights)


@module_rule(nn.MultiheadAttention)
def multihead_attention_module(
    b: Builder,
    m: nn.MultiheadAttention,
    query: Value,
    key: Value,
    value: Value,
    key_padding_mask: Value | None = None,
    need_weights: bool = True,
    attn_mask: Value | None = None,
    average_attn_weights: bool = True,
    is_causal: bool = False,
) -> tuple[Value, Value | None]:
    """nn.MultiheadAttention.forward as one lowering (the FX front end keeps the module a leaf)."""
    if m.bias_k is not None or m.bias_v is not None or m.add_zero_attn:
        raise LoweringError("MultiheadAttention: add_bias_kv / add_zero_attn are not supported")
    if query.rank != 3:
        raise LoweringError(f"MultiheadAttention: expected batched (3-D) inputs, got rank {query.rank}")
    if not m.batch_first:
        query, key, value = (_swap01(b, t) for t in (query, key, value))
    dtype = query.dtype or torch.float32
    mask = None
    if key_padding_mask is not None:
        mask = _padding_mask(b, key_padding_mask, dtype)
    if attn_mask is not None:
        extra = _attn_mask(b, attn_mask, m.num_heads, dtype)
        mask = extra if mask is None else add_masks(b, mask, extra)
    if m.in_proj_weight is not None:
        proj = _split(constant(m.in_proj_weight.detach(), label="in_proj_weight"), 3)
    else:
        proj = tuple(
            constant(getattr(m, f"{p}_proj_weight").detach(), label=f"{p}_proj_weight") for p in "qkv"
        )
    bias = constant(m.in_proj_bias.detach(), label="in_proj_bias") if m.in_proj_bias is not None else None
    out_w = constant(m.out_proj.weight.detach(), label="out_proj.weight")
    out_b = constant(m.out_proj.bias.detach(), label="out_proj.bias") if m.out_proj.bias is not None else None
    # without weights torch runs scaled_dot_product_attention: a row that attends to nothing is 0
    out, weights = multi_head(
        b, query, key, value, m.num_heads, proj, bias, out_w, out_b, mask, not need_weights
    )
    if not m.batch_first:
        out = _swap01(b, out)
    return out, _head_weights(b, weights, need_weights, average_attn_weights)


def _swap01(b: Builder, x: Value) -> Value:
    s = shape_of(x)
    return b.call("transpose", [x], {"axes": [1, 0, 2]}, dtype=x.dtype, shape=(s[1], s[0], s[2]))


def _call(b: Builder, key: str, *args: object) -> Value:
    """Reuse another family's rule (an activation) inside a fused lowering."""
    found = b.rules.lookup_function(key)
    if found is None:
        raise LoweringError(f"{key} has no rule, needed by _transformer_encoder_layer_fwd")
    return found.fn(b, *args)


@rule("aten::_transformer_encoder_layer_fwd")
def transformer_encoder_layer_fwd(
    b: Builder,
    src: Value,
    embed_dim: int,
    num_heads: int,
    qkv_weight: Value,
    qkv_bias: Value | None,
    proj_weight: Value,
    proj_bias: Value | None,
    use_gelu: bool,
    norm_first: bool,
    eps: float,
    norm_weight_1: Value,
    norm_bias_1: Value,
    norm_weight_2: Value,
    norm_bias_2: Value,
    ffn_weight_1: Value,
    ffn_bias_1: Value,
    ffn_weight_2: Value,
    ffn_bias_2: Value,
    mask: Value | None,
    mask_type: int | None,
) -> Value:
    """_transformer_encoder_layer_fwd(Tensor src, int embed_dim, int num_heads, Tensor qkv_weight,
    Tensor qkv_bias, Tensor proj_weight, Tensor proj_bias, bool use_gelu, bool norm_first, float eps,
    Tensor norm_weight_1, Tensor norm_bias_1, Tensor norm_weight_2, Tensor norm_bias_2,
    Tensor ffn_weight_1, Tensor ffn_bias_1, Tensor ffn_weight_2, Tensor ffn_bias_2, Tensor? mask=None,
    int? mask_type=None) -> Tensor

    nn.TransformerEncoderLayer's fused inference path (taken when no gradient is needed)."""
    from torchlower.rules.normalization import layer_norm

    def norm(x: Value, w: Value, bias: Value) -> Value:
        return layer_norm(b, x, [embed_dim], w, bias, eps, False)

    def residual(x: Value, y: Value) -> Value:
        return b.call("add", [x, y], dtype=x.dtype, shape=x.shape)

    x = norm(src, norm_weight_1, norm_bias_1) if norm_first else src
    attn = native_multi_head_attention(
        b,
        x,
        x,
        x,
        embed_dim,
        num_heads,
        qkv_weight,
        qkv_bias,
        proj_weight,
        proj_bias,
        mask,
        False,
        True,
        mask_type,
    )[0]
    x = residual(attn, src)
    if not norm_first:
        x = norm(x, norm_weight_1, norm_bias_1)
    h = norm(x, norm_weight_2, norm_bias_2) if norm_first else x
    h = _linear(b, h, ffn_weight_1, ffn_bias_1)
    h = _call(b, "aten::gelu", h, "none") if use_gelu else _call(b, "aten::relu", h)
    x = residual(_linear(b, h, ffn_weight_2, ffn_bias_2), x)
    return norm(x, norm_weight_2, norm_bias_2) if not norm_first else x

"""Dense products: linear, matmul and friends."""

from __future__ import annotations

from torchlower.rules import rule
from torchlower.rules.common import Builder, channel_param, shape_of, unsqueeze_to
from torchlower.values import Value


@rule("aten::linear")
def linear(b: Builder, x: Value, w: Value, bias: Value | None) -> Value:
    """linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor"""
    shape = (*shape_of(x)[:-1], shape_of(w)[0])
    w = unsqueeze_to(b, w, x.rank)  # tract's matmul wants equal ranks
    y = b.call("matmul", [x, w], {"transposeA": False, "transposeB": True}, dtype=x.dtype, shape=shape)
    if bias is None:
        return y
    bias = channel_param(bias, len(shape), axis=-1) if bias.is_const else unsqueeze_to(b, bias, len(shape))
    return b.call("add", [y, bias], dtype=x.dtype, shape=shape)

"""Dense products: linear, matmul and friends (tract's ``matmul`` wants equal ranks)."""

from __future__ import annotations

from torchlower.core.values import Value, constant
from torchlower.rules import rule
from torchlower.rules.common import Builder, Scalar, channel_param, shape_of, unsqueeze_to


@rule("aten::linear")
def linear(b: Builder, x: Value, w: Value, bias: Value | None) -> Value:
    """linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor"""
    if x.rank == 1:  # tract's matmul needs equal ranks and the weight is 2-D: go through [1, K]
        row = b.call("unsqueeze", [x], {"axes": [0]}, dtype=x.dtype, shape=(1, *shape_of(x)))
        y = linear(b, row, w, bias)
        return b.call("squeeze", [y], {"axes": [0]}, dtype=x.dtype, shape=shape_of(y)[1:])
    shape = (*shape_of(x)[:-1], shape_of(w)[0])
    w = unsqueeze_to(b, w, x.rank)
    y = b.call("matmul", [x, w], {"transposeA": False, "transposeB": True}, dtype=x.dtype, shape=shape)
    if bias is None:
        return y
    bias = channel_param(bias, len(shape), axis=-1) if bias.is_const else unsqueeze_to(b, bias, len(shape))
    return b.call("add", [y, bias], dtype=x.dtype, shape=shape)


@rule("aten::matmul", "aten::mm", "aten::bmm")
def matmul(b: Builder, x: Value, y: Value) -> Value:
    """matmul(Tensor self, Tensor other) -> Tensor  (also mm, bmm)

    1-D operands get a unit dim (prepended for ``x``, appended for ``y``) that is removed after,
    as in NumPy; batch dims broadcast after aligning ranks.
    """
    squeeze: list[int] = []
    if x.rank == 1:
        x = _unsqueeze(b, x, 0)
        squeeze.append(-2)
    if y.rank == 1:
        y = _unsqueeze(b, y, 1)
        squeeze.append(-1)
    rank = max(x.rank, y.rank)
    xs, ys = shape_of(x), shape_of(y)
    batch = [
        _broadcast_dim(p, q) for p, q in zip(_pad(xs[:-2], rank - 2), _pad(ys[:-2], rank - 2), strict=True)
    ]
    shape = (*batch, xs[-2], ys[-1])
    x, y = unsqueeze_to(b, x, rank), unsqueeze_to(b, y, rank)
    out = b.call("matmul", [x, y], {"transposeA": False, "transposeB": False}, dtype=x.dtype, shape=shape)
    if squeeze:
        axes = sorted(a % rank for a in squeeze)
        out = b.call("squeeze", [out], {"axes": axes}, dtype=x.dtype)
    return out


@rule("aten::addmm")
def addmm(b: Builder, bias: Value, x: Value, w: Value, beta: Scalar, alpha: Scalar) -> Value:
    """addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor

    Scales fold into constant operands at export time, so ``nn.Linear`` traced as addmm costs
    one matmul and one add.
    """
    if alpha != 1:
        w = (
            constant(w.const * alpha, label=w.label)
            if w.is_const
            else b.call("mul", [w, float(alpha)], dtype=w.dtype, shape=w.shape)  # matmul reads the shape
        )
    out = matmul(b, x, w)
    if beta == 0:
        return out
    if beta != 1:
        bias = (
            constant(bias.const * beta)
            if bias.is_const
            else b.call("mul", [bias, float(beta)], dtype=bias.dtype, shape=bias.shape)
        )
    out_rank = len(out.shape) if out.shape is not None else 2
    return b.call("add", [out, unsqueeze_to(b, bias, out_rank)], dtype=x.dtype, shape=out.shape)


@rule("aten::baddbmm")
def baddbmm(b: Builder, bias: Value, x: Value, w: Value, beta: Scalar, alpha: Scalar) -> Value:
    """baddbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1) -> Tensor

    ``nn.MultiheadAttention``'s slow path (need_weights=True) scales q·kᵀ this way.
    """
    return addmm(b, bias, x, w, beta, alpha)


def _unsqueeze(b: Builder, x: Value, axis: int) -> Value:
    shape = list(shape_of(x))
    shape.insert(axis, 1)
    if x.is_const:
        return constant(x.const.unsqueeze(axis), label=x.label)
    return b.call("unsqueeze", [x], {"axes": [axis]}, dtype=x.dtype, shape=tuple(shape))


def _pad(dims: tuple, n: int) -> tuple:
    return (1,) * (n - len(dims)) + tuple(dims)


def _broadcast_dim(p: int | str, q: int | str) -> int | str:
    return q if p == 1 else p

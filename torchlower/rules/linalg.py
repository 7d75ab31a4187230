"""Vector / matrix products and distances: dot, mv, outer, addmv/addr/addbmm, einsum, bilinear,
cross, cosine_similarity, pairwise_distance, cdist, plus bucketize/searchsorted/count_nonzero.

All lower onto tract's ``matmul`` (equal ranks) or broadcast elementwise ops and reductions.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torchlower.core.values import Value, constant, normalize_dim
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder, Operand, Scalar, align_ranks, broadcast_shapes, cast, shape_of
from torchlower.rules.layout import dims_of, gather_axis, transpose, unsqueeze
from torchlower.rules.layout_extra import diagonal
from torchlower.rules.linear import matmul


def _bin(b: Builder, op: str, x: Operand, y: Operand, dtype: torch.dtype | None = None) -> Value:
    x, y = align_ranks(b, x, y)
    shape = broadcast_shapes(shape_of(x), shape_of(y))  # keeps symbolic dims
    ref = x if isinstance(x, Value) else y
    return b.call(op, [x, y], dtype=dtype or ref.dtype, shape=shape)


def _reduce(b: Builder, op: str, x: Value, axes: Sequence[int], keepdim: bool) -> Value:
    axes = sorted(normalize_dim(a, x.rank) for a in axes)
    shape = tuple(1 if i in axes else d for i, d in enumerate(dims_of(x)))
    y = b.call(op, [x], {"axes": axes}, dtype=x.dtype, shape=shape)
    if keepdim:
        return y
    out = tuple(d for i, d in enumerate(dims_of(x)) if i not in axes)
    return b.call("squeeze", [y], {"axes": axes}, dtype=x.dtype, shape=out)


def _matmul(b: Builder, x: Value, y: Value) -> Value:
    """``matmul`` with its result shape known (1-D operands leave it unset in the rule)."""
    shape = torch.matmul(torch.empty(dims_of(x), device="meta"), torch.empty(dims_of(y), device="meta")).shape
    return matmul(b, x, y).with_meta(None, tuple(shape))


def _scaled(b: Builder, x: Value, k: Scalar) -> Value:
    if k == 1:
        return x
    return constant(x.const * k, label=x.label) if x.is_const else _bin(b, "mul", x, float(k))


def _axpby(b: Builder, bias: Value, product: Value, beta: Scalar, alpha: Scalar) -> Value:
    """``beta * bias + alpha * product``; torch ignores ``bias`` entirely when beta == 0."""
    product = _scaled(b, product, alpha)
    return product if beta == 0 else _bin(b, "add", _scaled(b, bias, beta), product)


@rule("aten::dot", "aten::vdot", "aten::inner")
def dot(b: Builder, x: Value, y: Value) -> Value:
    """dot(Tensor self, Tensor tensor) -> Tensor  (vdot equals dot for real tensors; also inner)"""
    if x.dtype.is_complex or (isinstance(y, Value) and y.dtype.is_complex):
        raise LoweringError("dot/vdot: complex tensors are not supported")
    if x.rank == 1 and y.rank == 1:
        return _reduce(b, "sum_reduce", _bin(b, "mul", x, y), [0], False)
    if x.rank == 0 or y.rank == 0:
        return _bin(b, "mul", x, y)
    if y.rank > 2:  # inner contracts last dims: x.shape[:-1] + y.shape[:-1]
        raise LoweringError(f"inner: second operand of rank {y.rank} > 2 is not supported (expected <= 2)")
    return _matmul(b, x, transpose(b, y, [1, 0]) if y.rank == 2 else y)


@rule("aten::mv")
def mv(b: Builder, m: Value, v: Value) -> Value:
    """mv(Tensor self, Tensor vec) -> Tensor"""
    return _matmul(b, m, v)


@rule("aten::outer", "aten::ger")
def outer(b: Builder, x: Value, y: Value) -> Value:
    """outer(Tensor self, Tensor vec2) -> Tensor  (ger is its old name)"""
    return _bin(b, "mul", unsqueeze(b, x, [1]), y)


@rule("aten::addmv")
def addmv(b: Builder, bias: Value, m: Value, v: Value, beta: Scalar, alpha: Scalar) -> Value:
    """addmv(Tensor self, Tensor mat, Tensor vec, *, Scalar beta=1, Scalar alpha=1) -> Tensor"""
    return _axpby(b, bias, _matmul(b, m, v), beta, alpha)


@rule("aten::addr")
def addr(b: Builder, bias: Value, x: Value, y: Value, beta: Scalar, alpha: Scalar) -> Value:
    """addr(Tensor self, Tensor vec1, Tensor vec2, *, Scalar beta=1, Scalar alpha=1) -> Tensor"""
    return _axpby(b, bias, outer(b, x, y), beta, alpha)


@rule("aten::addbmm")
def addbmm(b: Builder, bias: Value, x: Value, y: Value, beta: Scalar, alpha: Scalar) -> Value:
    """addbmm(Tensor self, Tensor batch1, Tensor batch2, *, Scalar beta=1, Scalar alpha=1) -> Tensor"""
    return _axpby(b, bias, _reduce(b, "sum_reduce", _matmul(b, x, y), [0], False), beta, alpha)


def _einsum_terms(equation: str, ranks: Sequence[int]) -> tuple[list[str], str]:
    """Operand and output subscripts with any ``...`` expanded into fresh letters."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise LoweringError(f"einsum '{equation}': {len(terms)} subscripts for {len(ranks)} operands")
    used = set(eq)
    fresh = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in used]
    n_ell = max((r - len(t) + 3 for t, r in zip(terms, ranks, strict=True) if "..." in t), default=0)
    ell = "".join(fresh[:n_ell])
    terms = [t.replace("...", ell[n_ell - (r - len(t) + 3) :]) for t, r in zip(terms, ranks, strict=True)]
    if arrow:
        out = rhs.replace("...", ell)
    else:
        letters = "".join(terms)
        out = ell + "".join(sorted(c for c in set(letters) if letters.count(c) == 1 and c not in ell))
    return terms, out


@rule("aten::einsum")
def einsum(b: Builder, equation: str, operands: Sequence[Value], path: Sequence[int] | None) -> Value:
    """einsum(str equation, Tensor[] tensors, *, int[]? path=None) -> Tensor

    Each operand is laid out on the union of subscripts (unit dims where absent), the operands
    are multiplied with broadcasting and the contracted subscripts are summed. A subscript
    repeated within one operand (``'ii->i'``, ``'bii'``) first takes that diagonal.
    """
    terms, out = _einsum_terms(equation, [o.rank for o in operands])
    if len(set(out)) != len(out):
        raise LoweringError(f"einsum '{equation}': output subscripts '{out}' repeat a letter")
    letters = "".join(dict.fromkeys(out + "".join(terms)))
    product: Value | None = None
    for term, x in zip(terms, operands, strict=True):
        if len(term) != x.rank:
            raise LoweringError(f"einsum '{equation}': subscripts '{term}' for an operand of rank {x.rank}")
        while len(set(term)) != len(term):  # diagonal of a repeated subscript: it moves last
            c = next(c for c in term if term.count(c) > 1)
            i = term.index(c)
            j = term.index(c, i + 1)
            x = diagonal(b, x, 0, i, j)
            term = "".join(t for k, t in enumerate(term) if k not in (i, j)) + c
        present = [c for c in letters if c in term]
        x = transpose(b, x, [term.index(c) for c in present])
        missing = [i for i, c in enumerate(letters) if c not in term]
        if missing:
            x = unsqueeze(b, x, missing)
        product = x if product is None else _bin(b, "mul", product, x)
    assert product is not None
    summed = [i for i, c in enumerate(letters) if c not in out]
    return _reduce(b, "sum_reduce", product, summed, False) if summed else product


@rule("aten::bilinear")
def bilinear(b: Builder, x1: Value, x2: Value, w: Value, bias: Value | None) -> Value:
    """bilinear(Tensor input1, Tensor input2, Tensor weight, Tensor? bias=None) -> Tensor

    y[..., o] = sum_ij x1[..., i] w[o, i, j] x2[..., j] + bias[o]: one matmul against w laid out
    as (i, o*j), one broadcast product with x2, one sum.
    """
    o, i, j = dims_of(w)
    lead = list(dims_of(x1)[:-1])
    if w.is_const:
        w2 = constant(w.const.permute(1, 0, 2).reshape(i, o * j), label=w.label)
    else:
        w2 = b.call(
            "reshape", [transpose(b, w, [1, 0, 2])], {"shape": [i, o * j]}, dtype=w.dtype, shape=(i, o * j)
        )
    t = _matmul(b, x1, w2)
    t = b.call("reshape", [t], {"shape": [*lead, o, j]}, dtype=x1.dtype, shape=(*lead, o, j))
    y = _reduce(b, "sum_reduce", _bin(b, "mul", t, unsqueeze(b, x2, [x2.rank - 1])), [-1], False)
    return y if bias is None else _bin(b, "add", y, bias)


@rule("aten::linalg_cross", "aten::cross")
def cross(b: Builder, x: Value, y: Value, dim: int | None) -> Value:
    """linalg_cross(Tensor self, Tensor other, *, int dim=-1) -> Tensor

    cross(self, other, int? dim=None): dim None means the first dimension of size 3.
    """
    x, y = align_ranks(b, x, y)
    if dim is None:
        shape = broadcast_shapes(shape_of(x), shape_of(y))
        dim = next((k for k, n in enumerate(shape) if n == 3), None)
        if dim is None:
            raise LoweringError("cross: no dimension of size 3")
    dim = normalize_dim(dim, x.rank)
    i1, i2 = constant(torch.tensor([1, 2, 0])), constant(torch.tensor([2, 0, 1]))
    a = _bin(b, "mul", gather_axis(b, x, i1, dim), gather_axis(b, y, i2, dim))
    c = _bin(b, "mul", gather_axis(b, x, i2, dim), gather_axis(b, y, i1, dim))
    return _bin(b, "sub", a, c)


def _norm(b: Builder, d: Value, p: float, axis: int, keepdim: bool) -> Value:
    """The p-norm of ``d`` over ``axis`` (p > 0 or inf)."""
    if p == float("inf"):
        return _reduce(b, "max_reduce", b.call("abs", [d], dtype=d.dtype, shape=d.shape), [axis], keepdim)
    if p <= 0:
        raise LoweringError(f"p-norm: p={p} is not supported (expected p > 0 or inf)")
    if p == 2:
        s = _reduce(b, "sum_reduce", _bin(b, "mul", d, d), [axis], keepdim)
        return b.call("sqrt", [s], dtype=d.dtype, shape=s.shape)
    a = b.call("abs", [d], dtype=d.dtype, shape=d.shape)
    s = _reduce(b, "sum_reduce", a if p == 1 else _bin(b, "pow", a, float(p)), [axis], keepdim)
    return s if p == 1 else _bin(b, "pow", s, 1.0 / p)


@rule("aten::cosine_similarity")
def cosine_similarity(b: Builder, x1: Value, x2: Value, dim: int, eps: float) -> Value:
    """cosine_similarity(Tensor x1, Tensor x2, int dim=1, float eps=1e-08) -> Tensor

    As torch: each input is divided by its norm clamped below at eps, then the dot product.
    """
    x1, x2 = align_ranks(b, x1, x2)
    axis = normalize_dim(dim, x1.rank)
    n1 = _bin(b, "max", _norm(b, x1, 2.0, axis, True), float(eps))
    n2 = _bin(b, "max", _norm(b, x2, 2.0, axis, True), float(eps))
    prod = _bin(b, "mul", _bin(b, "div", x1, n1), _bin(b, "div", x2, n2))
    return _reduce(b, "sum_reduce", prod, [axis], False)


@rule("aten::pairwise_distance")
def pairwise_distance(b: Builder, x1: Value, x2: Value, p: float, eps: float, keepdim: bool) -> Value:
    """pairwise_distance(Tensor x1, Tensor x2, float p=2, float eps=1e-06, bool keepdim=False) -> Tensor"""
    d = _bin(b, "add", _bin(b, "sub", x1, x2), float(eps))
    return _norm(b, d, float(p), d.rank - 1, keepdim)


@rule("aten::cdist")
def cdist(b: Builder, x1: Value, x2: Value, p: float, compute_mode: int | None) -> Value:
    """cdist(Tensor x1, Tensor x2, float p=2, int? compute_mode=None) -> Tensor

    Computed from differences (no ‖a‖²-2ab+‖b‖² cancellation), for any p > 0 or inf.
    """
    r = max(x1.rank, x2.rank)
    a = unsqueeze(b, x1, [x1.rank - 1])  # (..., P, 1, M)
    c = unsqueeze(b, x2, [x2.rank - 2])  # (..., 1, R, M)
    d = _bin(b, "sub", a, c)
    return _norm(b, d, float(p), r, False)


@rule("aten::bucketize.Tensor")
def bucketize(b: Builder, x: Value, boundaries: Value, out_int32: bool, right: bool) -> Value:
    """bucketize.Tensor(Tensor self, Tensor boundaries, *, bool out_int32=False, bool right=False) -> Tensor

    Limits: boundaries must be a constant 1-D tensor.
    """
    if not boundaries.is_const or boundaries.const.dim() != 1:
        raise LoweringError("bucketize: boundaries must be a constant 1-D tensor")
    bounds = constant(boundaries.const.to(x.dtype).reshape([1] * x.rank + [-1]))
    below = _bin(b, "le" if right else "lt", bounds, unsqueeze(b, x, [x.rank]), torch.bool)
    dtype = torch.int32 if out_int32 else torch.int64
    return _reduce(b, "sum_reduce", cast(b, below, dtype), [x.rank], False)


@rule("aten::searchsorted.Tensor")
def searchsorted(
    b: Builder, seq: Value, x: Value, out_int32: bool, right: bool, side: str | None, sorter: Value | None
) -> Value:
    """searchsorted.Tensor(Tensor sorted_sequence, Tensor self, *, bool out_int32=False, bool right=False,
    str? side=None, Tensor? sorter=None) -> Tensor

    Limits: a constant 1-D sorted_sequence, no sorter.
    """
    if sorter is not None:
        raise LoweringError("searchsorted: sorter is not supported (expected None)")
    return bucketize(b, x, seq, out_int32, right or side == "right")


@rule("aten::count_nonzero.dim_IntList", "aten::count_nonzero")
def count_nonzero(b: Builder, x: Value, dim: int | Sequence[int] | None) -> Value:
    """count_nonzero.dim_IntList(Tensor self, int[] dim) -> Tensor  (count_nonzero: int? dim=None)"""
    dims = list(range(x.rank)) if dim is None else [dim] if isinstance(dim, int) else list(dim)
    nz = b.call("ne", [x, _zero(x)], dtype=torch.bool, shape=x.shape)
    return _reduce(b, "sum_reduce", cast(b, nz, torch.int64), dims or list(range(x.rank)), False)


def _zero(x: Value) -> Operand:
    if x.dtype == torch.float32:
        return 0.0
    if x.dtype == torch.bool:
        return False
    return constant(torch.zeros([1] * x.rank, dtype=x.dtype))

"""Running scans: cumsum, cumprod, cummax, cummin (values and indices) and logcumsumexp.

A log-depth shift-and-combine scan, so tract sees only slices, pads and elementwise ops; over a
dynamic axis (position ids from a padding mask, ``cumsum(mask, 1)``) cumsum is a masked sum of
an ``n × n`` lower triangle instead, since the number of shift steps would depend on ``n``.
"""

from __future__ import annotations

import torch

from torchlower.core.values import Dim, Value, constant, normalize_dim
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder, cast, reshape, shape_of
from torchlower.rules.layout import dims_of, transpose

# ---- cumulative -----------------------------------------------------------------------------


def emit_scan(b: Builder, x: Value, dim: int, op: str, identity: float) -> Value:
    """Inclusive scan in ceil(log2 n) shift-and-combine steps (Hillis–Steele)."""
    axis = normalize_dim(dim, x.rank)
    n = shape_of(x)[axis]
    if not isinstance(n, int) and op == "add":
        return _triangle_sum(b, x, axis, n)
    if not isinstance(n, int):
        raise LoweringError(f"cumulative op: dim {dim} must have a static size, got {n!r}")
    step = 1
    while step < n:
        head = b.call("slice", [x], {"axes": [axis], "begin": [0], "end": [n - step]}, dtype=x.dtype)
        padding = [(0, 0)] * x.rank
        padding[axis] = (step, 0)
        attrs = {"padding": padding, "border": "constant", "value": identity}
        shifted = b.call("pad", [head], attrs, dtype=x.dtype, shape=x.shape)
        x = b.call(op, [x, shifted], dtype=x.dtype, shape=x.shape)
        step *= 2
    return x


def _scan_input(b: Builder, x: Value, dtype: torch.dtype | None) -> Value:
    if dtype is None and x.dtype is not None and not x.dtype.is_floating_point:
        dtype = torch.int64  # torch accumulates integers and bools in int64
    return cast(b, x, dtype) if dtype is not None else x


@rule("aten::cumsum", "aten::cumsum_")
def cumsum(b: Builder, x: Value, dim: int, dtype: torch.dtype | None = None) -> Value:
    """cumsum(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor"""
    x = _scan_input(b, x, dtype)
    return emit_scan(b, x, dim, "add", 0.0 if x.dtype is None or x.dtype.is_floating_point else 0)


@rule("aten::cumprod", "aten::cumprod_")
def cumprod(b: Builder, x: Value, dim: int, dtype: torch.dtype | None = None) -> Value:
    """cumprod(Tensor self, int dim, *, ScalarType? dtype=None) -> Tensor

    float32 runs in float64, as torch's CPU kernel accumulates: the scan's other association
    overflowed near the float32 range (a product of -1.7e38 came back -inf, issue 32 fuzz).
    """
    x = _scan_input(b, x, dtype)
    if x.dtype == torch.float32:
        return cast(b, emit_scan(b, cast(b, x, torch.float64), dim, "mul", 1.0), torch.float32)
    return emit_scan(b, x, dim, "mul", 1.0 if x.dtype is None or x.dtype.is_floating_point else 1)


def _triangle_sum(b: Builder, x: Value, axis: int, n: Dim) -> Value:
    """``cumsum`` over an axis of symbolic size n: ``x @ L^T`` with L the lower triangle
    ``j <= i`` (integers in f64: exact below 2**53). Limit: an inf at a later position turns
    earlier sums into NaN (inf · 0); a masked ``select`` + ``sum_reduce`` would avoid that, but
    tract 0.23.9 evaluates that pattern over a symbolic triangle at the wrong size."""
    perm = [d for d in range(x.rank) if d != axis] + [axis]
    moved = transpose(b, x, perm)
    lead = list(shape_of(moved))[:-1] or [1]
    moved = reshape(b, moved, [*lead, n])
    work = x.dtype if x.dtype is not None and x.dtype.is_floating_point else torch.float64
    index = b.call("tract_core_range", [0, n, 1], dtype=torch.int64, shape=(n,))
    rows = reshape(b, index, [n, 1])
    cols = reshape(b, index, [1, n])
    below = cast(b, b.call("le", [cols, rows], dtype=torch.bool, shape=(n, n)), work)
    below = reshape(b, below, [1] * (len(lead) - 1) + [n, n])
    attrs = {"transposeA": False, "transposeB": True}
    out = b.call("matmul", [cast(b, moved, work), below], attrs, dtype=work, shape=(*lead, n))
    out = reshape(b, cast(b, out, x.dtype), [*list(shape_of(x))[:axis], *list(shape_of(x))[axis + 1 :], n])
    return transpose(b, out, [perm.index(d) for d in range(x.rank)])


def _running(b: Builder, x: Value, dim: int, op: str) -> tuple[Value, Value]:
    """Running max/min and the index torch reports: the last position where the extreme was reached.

    torch moves the index whenever ``x[j]`` ties or beats the running extreme, i.e. exactly where
    ``x[j] == values[j]``; a running max of those positions is the index.
    Limits: NaN inputs (torch propagates NaN and its index) are not reproduced.
    """
    if x.rank == 0:
        raise LoweringError("cummax/cummin: a 0-d input is not supported (expected rank >= 1)")
    if not x.dtype.is_floating_point:
        raise LoweringError(f"cummax/cummin: floating-point input expected, got {x.dtype}")
    axis = normalize_dim(dim, x.rank)
    shape = dims_of(x)
    values = emit_scan(b, x, axis, op, float("-inf") if op == "max" else float("inf"))
    view = [1] * x.rank
    view[axis] = shape[axis]
    positions = constant(torch.arange(shape[axis]).reshape(view).expand(shape).contiguous())
    hit = b.call("eq", [x, values], dtype=torch.bool, shape=shape)
    zeros = constant(torch.zeros([1] * x.rank, dtype=torch.int64))
    marks = b.call("select", [hit, positions, zeros], dtype=torch.int64, shape=shape)
    return values, emit_scan(b, marks, axis, "max", 0)


@rule("aten::cummax")
def cummax(b: Builder, x: Value, dim: int) -> tuple[Value, Value]:
    """cummax(Tensor self, int dim) -> (Tensor values, Tensor indices)"""
    return _running(b, x, dim, "max")


@rule("aten::cummin")
def cummin(b: Builder, x: Value, dim: int) -> tuple[Value, Value]:
    """cummin(Tensor self, int dim) -> (Tensor values, Tensor indices)"""
    return _running(b, x, dim, "min")


@rule("aten::logcumsumexp")
def logcumsumexp(b: Builder, x: Value, dim: int) -> Value:
    """logcumsumexp(Tensor self, int dim) -> Tensor

    log(cumsum(exp(x - m))) + m with m the max over ``dim``, so exp never overflows.
    Limits: prefixes far below the slice's max (< m - 80) underflow to -inf where torch is finite.
    """
    if not x.dtype.is_floating_point:
        raise LoweringError(f"logcumsumexp: floating-point input expected, got {x.dtype}")
    axis = normalize_dim(dim, x.rank)
    keep = tuple(1 if i == axis else d for i, d in enumerate(dims_of(x)))
    m = b.call("max_reduce", [x], {"axes": [axis]}, dtype=x.dtype, shape=keep)
    e = b.call("exp", [b.call("sub", [x, m], dtype=x.dtype, shape=x.shape)], dtype=x.dtype, shape=x.shape)
    s = emit_scan(b, e, axis, "add", 0.0)
    return b.call("add", [b.call("log", [s], dtype=x.dtype, shape=x.shape), m], dtype=x.dtype, shape=x.shape)

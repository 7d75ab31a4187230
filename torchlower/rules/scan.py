"""Running scans beyond cumsum/cumprod: cummax, cummin (values and indices) and logcumsumexp.

They reuse math.py's log-depth shift-and-combine scan, so tract sees only slices, pads and
elementwise ops.
"""

from __future__ import annotations

import torch

from torchlower.core.values import Value, constant, normalize_dim
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder
from torchlower.rules.layout import dims_of
from torchlower.rules.math import emit_scan


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

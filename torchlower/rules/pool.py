"""Pooling: max/avg (1-3 d), adaptive avg/max with any output size.

torch semantics that NNEF's box/max_pool do not express directly are handled at export time:
``ceil_mode`` becomes extra right padding; when that padding (or ``divisor_override``) would
change an average's divisor, the sum is scaled by a constant divisor map computed with torch
itself. Non-divisible adaptive averages are matmuls with constant averaging matrices.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from torchlower.core.values import Shape, Value, constant
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder, shape_of

Pairs = list[tuple[int, int]]


def _expand(values: Sequence[int] | int, n: int, name: str) -> list[int]:
    values = [values] if isinstance(values, int) else list(values)
    if len(values) == 1:
        values = values * n
    if len(values) != n:
        raise LoweringError(f"pool: {name} has {len(values)} entries, expected 1 or {n}")
    return [int(v) for v in values]


def _spatial(x: Value, n: int, what: str) -> list[int]:
    dims = shape_of(x)[-n:]
    if any(not isinstance(d, int) for d in dims):
        raise LoweringError(f"{what}: spatial dims must be static, got {dims}")
    return [int(d) for d in dims]


def _batched(b: Builder, x: Value, n: int) -> tuple[Value, bool]:
    """Pools take ``[N, C, *spatial]``; an unbatched ``[C, *spatial]`` input gets a unit N."""
    if x.rank == n + 2:
        return x, False
    return b.call("unsqueeze", [x], {"axes": [0]}, dtype=x.dtype, shape=(1, *shape_of(x))), True


def _unbatched(b: Builder, y: Value, was: bool) -> Value:
    if not was:
        return y
    return b.call(
        "squeeze", [y], {"axes": [0]}, dtype=y.dtype, shape=None if y.shape is None else y.shape[1:]
    )


def _window(
    x: Value,
    n: int,
    kernel: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    ceil_mode: bool,
) -> tuple[list[int], list[int], list[int], Pairs, list[int]]:
    """Kernel, stride, dilation, NNEF padding (ceil_mode as extra right padding), output size."""
    k = _expand(kernel, n, "kernel_size")
    s = _expand(stride, n, "stride") if len(stride) else k
    p = _expand(padding, n, "padding")
    d = _expand(dilation, n, "dilation")
    pairs: Pairs = []
    out: list[int] = []
    dims = list(shape_of(x)[-n:])
    if any(not isinstance(i, int) for i in dims) and not ceil_mode:
        # dynamic H/W: NNEF's explicit padding floors like torch, so the padding is symmetric and
        # the output size an expression tract evaluates (ceil_mode's extra padding depends on the size)
        for i, kk, ss, pp, dd in zip(dims, k, s, p, d, strict=True):
            pairs.append((pp, pp))
            out.append((i + (2 * pp - dd * (kk - 1) - 1)) // ss + 1)
        return k, s, d, pairs, out
    for i, kk, ss, pp, dd in zip(_spatial(x, n, "pool"), k, s, p, d, strict=True):
        span = dd * (kk - 1) + 1
        o = (i + 2 * pp - span + (ss - 1 if ceil_mode else 0)) // ss + 1
        if ceil_mode and (o - 1) * ss >= i + pp:  # the last window must start inside the input
            o -= 1
        pairs.append((pp, pp + max(0, (o - 1) * ss + span - (i + 2 * pp))))
        out.append(o)
    return k, s, d, pairs, out


def _full(values: Sequence[int], fill: int = 1) -> list[int]:
    return [fill, fill, *values]


@rule("aten::max_pool1d", "aten::max_pool2d", "aten::max_pool3d")
def max_pool(
    b: Builder,
    x: Value,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    dilation: Sequence[int],
    ceil_mode: bool,
) -> Value:
    """max_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0,
    int[2] dilation=1, bool ceil_mode=False) -> Tensor"""
    n = len(kernel_size)  # int[N] in the schema: front ends pass one entry per spatial dim
    x, unbatched = _batched(b, x, n)
    k, s, d, pairs, out = _window(x, n, kernel_size, stride, padding, dilation, ceil_mode)
    attrs = {
        "size": _full(k),
        "border": "ignore",
        "padding": [(0, 0), (0, 0), *pairs],
        "stride": _full(s),
        "dilation": _full(d),
    }
    # float NaN and all -inf windows as torch: nnef/guards_values.py (nan_pools)
    y = b.call("max_pool", [x], attrs, dtype=x.dtype, shape=(*shape_of(x)[:2], *out))
    return _unbatched(b, y, unbatched)


@rule("aten::avg_pool1d", "aten::avg_pool2d", "aten::avg_pool3d")
def avg_pool(
    b: Builder,
    x: Value,
    kernel_size: Sequence[int],
    stride: Sequence[int],
    padding: Sequence[int],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: int | None = None,
) -> Value:
    """avg_pool2d(Tensor self, int[2] kernel_size, int[2] stride=[], int[2] padding=0,
    bool ceil_mode=False, bool count_include_pad=True, int? divisor_override=None) -> Tensor"""
    n = len(kernel_size)  # int[N] in the schema: front ends pass one entry per spatial dim
    x, unbatched = _batched(b, x, n)
    k, s, d, pairs, out = _window(x, n, kernel_size, stride, padding, [1], ceil_mode)
    shape: Shape = (*shape_of(x)[:2], *out)
    extra = any(hi != lo for lo, hi in pairs)
    exact = not extra and divisor_override is None  # box's own divisor is torch's
    attrs = {
        "size": _full(k),
        "border": "constant" if count_include_pad or not exact else "ignore",
        "padding": [(0, 0), (0, 0), *pairs],
        "stride": _full(s),
        "dilation": _full(d),
        "normalize": exact,
    }
    y = b.call("box", [x], attrs, dtype=x.dtype, shape=shape)
    if not exact:
        scale = 1.0 / _divisor_map(x, n, k, s, padding, ceil_mode, count_include_pad, divisor_override)
        y = b.call("mul", [y, constant(scale.to(x.dtype or torch.float32))], dtype=x.dtype, shape=shape)
    return _unbatched(b, y, unbatched)


def _divisor_map(
    x: Value,
    n: int,
    k: list[int],
    s: list[int],
    padding: Sequence[int],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: int | None,
) -> torch.Tensor:
    """torch's divisor per output position, shape ``[1, 1, *out]``, found by pooling ones."""
    if divisor_override is not None:
        if divisor_override == 0:
            raise LoweringError("avg_pool: divisor_override must be non-zero, got 0")
        return torch.tensor(float(divisor_override)).reshape([1] * (n + 2))
    p = _expand(padding, n, "padding")
    ones = torch.ones(1, 1, *(_spatial(x, n, "avg_pool") if n > 1 else [1, *_spatial(x, n, "avg_pool")]))
    pool = F.avg_pool3d if n == 3 else F.avg_pool2d
    k2, s2, p2 = (k, s, p) if n > 1 else ([1, *k], [1, *s], [0, *p])
    counts = pool(ones, k2, s2, p2, ceil_mode, count_include_pad, divisor_override=1)
    means = pool(ones, k2, s2, p2, ceil_mode, count_include_pad)
    divisor = (counts / means).double()
    return divisor if n > 1 else divisor.squeeze(2)


@rule("aten::adaptive_avg_pool1d", "aten::adaptive_avg_pool2d", "aten::adaptive_avg_pool3d")
def adaptive_avg_pool(b: Builder, x: Value, output_size: Sequence[int | None]) -> Value:
    """adaptive_avg_pool2d(Tensor self, SymInt[2] output_size) -> Tensor  (any output size)"""
    n = len(output_size)
    first = x.rank - n
    if all(o == 1 for o in output_size):  # a global average: any (dynamic) spatial size
        shape = (*shape_of(x)[:first], *([1] * n))
        return b.call("mean_reduce", [x], {"axes": list(range(first, x.rank))}, dtype=x.dtype, shape=shape)
    sizes = _spatial(x, n, "adaptive_avg_pool")
    outs = [i if o is None else int(o) for i, o in zip(sizes, output_size, strict=True)]
    shape = (*shape_of(x)[:first], *outs)
    if all(o == 1 for o in outs):
        axes = list(range(first, x.rank))
        return b.call("mean_reduce", [x], {"axes": axes}, dtype=x.dtype, shape=shape)
    if all(i % o == 0 for i, o in zip(sizes, outs, strict=True)) and x.rank == n + 2:
        k = [i // o for i, o in zip(sizes, outs, strict=True)]
        attrs = {"size": _full(k), "border": "constant", "stride": _full(k), "normalize": True}
        attrs["padding"] = [(0, 0)] * x.rank
        return b.call("box", [x], attrs, dtype=x.dtype, shape=shape)
    if n > 2:
        raise LoweringError(f"adaptive_avg_pool3d: output size {outs} must divide the input size {sizes}")
    y = x
    for axis, (i, o) in enumerate(zip(sizes, outs, strict=True), start=first):
        if i != o:
            y = _average_along(b, y, axis, i, o)
    return y


_WINDOWED = 16  # adaptive averages with at most this many windows are means of slices


def _average_along(b: Builder, x: Value, axis: int, size: int, out: int) -> Value:
    """Adaptive average along ``axis`` (one of the last two): the mean of each window's slice,
    concatenated (an infinite input stays in its own windows, as in torch), or, past
    ``_WINDOWED`` windows, a matmul with a constant matrix (whose zeros make ``0 · inf`` NaN)."""
    if out <= _WINDOWED:
        shape = list(shape_of(x))
        shape[axis] = 1
        parts = []
        for j in range(out):
            lo, hi = (j * size) // out, -((-(j + 1) * size) // out)
            sliced = list(shape_of(x))
            sliced[axis] = hi - lo
            attrs = {"axes": [axis], "begin": [lo], "end": [hi]}
            part = b.call("slice", [x], attrs, dtype=x.dtype, shape=tuple(sliced))
            parts.append(b.call("mean_reduce", [part], {"axes": [axis]}, dtype=x.dtype, shape=tuple(shape)))
        shape[axis] = out
        return b.call("concat", [parts], {"axis": axis}, dtype=x.dtype, shape=tuple(shape))
    m = torch.zeros(out, size, dtype=torch.float64)
    for j in range(out):
        lo, hi = (j * size) // out, -((-(j + 1) * size) // out)
        m[j, lo:hi] = 1.0 / (hi - lo)
    last = axis == x.rank - 1
    m = m.t() if last else m
    mat = m.to(x.dtype or torch.float32).reshape([1] * (x.rank - 2) + list(m.shape))
    shape = list(shape_of(x))
    shape[axis] = out
    args = [x, constant(mat)] if last else [constant(mat), x]
    return b.call(
        "matmul", args, {"transposeA": False, "transposeB": False}, dtype=x.dtype, shape=tuple(shape)
    )


@rule("aten::adaptive_max_pool1d", "aten::adaptive_max_pool2d")
def adaptive_max_pool(b: Builder, x: Value, output_size: Sequence[int | None]) -> tuple[Value, None]:
    """adaptive_max_pool2d(Tensor self, int[2] output_size) -> (Tensor, Tensor)

    Values only: the indices output is not produced (None).
    """
    n = len(output_size)
    sizes = _spatial(x, n, "adaptive_max_pool")
    outs = [i if o is None else int(o) for i, o in zip(sizes, output_size, strict=True)]
    first = x.rank - n
    y = x
    for axis, (i, o) in enumerate(zip(sizes, outs, strict=True), start=first):
        if i == o:
            continue
        shape = list(shape_of(y))
        shape[axis] = 1
        parts = []
        for j in range(o):  # max is separable: reduce each window of this axis, then concat
            lo, hi = (j * i) // o, -((-(j + 1) * i) // o)
            part = y
            if (lo, hi) != (0, i):
                sliced = list(shape_of(y))
                sliced[axis] = hi - lo
                attrs = {"axes": [axis], "begin": [lo], "end": [hi]}
                part = b.call("slice", [y], attrs, dtype=x.dtype, shape=tuple(sliced))
            parts.append(b.call("max_reduce", [part], {"axes": [axis]}, dtype=x.dtype, shape=tuple(shape)))
        shape[axis] = o
        y = (
            parts[0]
            if o == 1
            else b.call("concat", [parts], {"axis": axis}, dtype=x.dtype, shape=tuple(shape))
        )
    return y, None

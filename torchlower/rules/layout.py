"""Layout beyond the basics: slicing, expanding, repeating, rolling, splitting, stacking.

Shapes are read from the values (the front end observed them), so torch's index arithmetic
(negative starts, ``end = 2**63 - 1``, uneven chunks) is resolved at export time and tract
only sees in-range, non-negative bounds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from torchlower.core.values import Dim, SymDim, Value, constant, normalize_dim
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder, Operand, reshape, unsqueeze_to


def dims_of(x: Value) -> tuple[Dim, ...]:
    """Shape of ``x``: ints, or SymDim expressions for dynamic axes (tract evaluates them)."""
    if x.shape is None:
        raise ValueError(f"value {x.name} has no known shape")
    return tuple(x.shape)


def clamp_index(i: Dim | None, n: Dim, default: Dim) -> Dim:
    """torch slice bound semantics: None → default, negative counts from the end, then clamp.

    On a dynamic dim the clamp is symbolic: ``end`` past any size means the size, a negative
    bound counts from the symbolic end, and other bounds are taken as in range.
    """
    if i is None:
        return default
    if isinstance(i, int) and i == 0:  # a size is never negative: no clamp (sympy cannot tell)
        return 0
    if isinstance(i, SymDim) or isinstance(n, SymDim):
        if isinstance(i, int) and i >= 2**31:
            return n
        if isinstance(i, int) and isinstance(n, SymDim):  # torch clamps: x[:, :1000], x[:, -3:]
            return _sym_clamp(n + i if i < 0 else i, n)
        return n + i if isinstance(i, int) and i < 0 else i
    i = int(i)
    if i < 0:
        i += n
    return min(max(i, 0), n)


def _sym_clamp(i: Dim, n: SymDim) -> Dim:
    """``min(max(i, 0), n)`` as a size expression (tract's TDim has min and max)."""
    import sympy

    e = i.expr if isinstance(i, SymDim) else sympy.Integer(i)
    return SymDim.wrap(sympy.Min(sympy.Max(e, 0), n.expr))


def slice_dim(b: Builder, x: Value, dim: int, start: int, end: int, step: int = 1) -> Value:
    """``x`` sliced on ``dim`` with already-normalised, in-range bounds (``0 <= start < end <= n``)."""
    shape = list(dims_of(x))
    if start == 0 and end == shape[dim] and step == 1:
        return x
    if isinstance(start, int) and isinstance(end, int) and end <= start:
        shape[dim] = 0
        if x.dtype is not None and all(isinstance(d, int) for d in shape):
            # an empty constant, which `cat` drops (the pass-through half of a full rotary
            # embedding, x[..., d:] with d = dim)
            return constant(torch.empty(shape, dtype=x.dtype))
        # other dims symbolic: a real empty slice keeps them (tract slices n:n to size 0)
        n = dims_of(x)[dim]
        if not isinstance(n, int):
            raise LoweringError(
                f"slice of {x.name} on dim {dim} is empty ({start}:{end}) and its size is symbolic;"
                " make that dim static"
            )
        attrs = {"axes": [dim], "begin": [n], "end": [n]}
        return b.call("slice", [x], attrs, dtype=x.dtype, shape=tuple(shape))
    shape[dim] = (end - start + step - 1) // step
    attrs = {"axes": [dim], "begin": [start], "end": [end]}
    if step != 1:
        attrs["stride"] = [step]
    return b.call("slice", [x], attrs, dtype=x.dtype, shape=tuple(shape))


def transpose(b: Builder, x: Value, perm: Sequence[int]) -> Value:
    """``x`` permuted by ``perm`` (identity permutations emit nothing)."""
    perm = [int(p) for p in perm]
    if perm == sorted(perm):
        return x
    shape = tuple(x.shape[p] for p in perm) if x.shape is not None else None
    return b.call("transpose", [x], {"axes": perm}, dtype=x.dtype, shape=shape)


def squeeze(b: Builder, x: Value, axes: Sequence[int]) -> Value:
    shape = tuple(d for i, d in enumerate(dims_of(x)) if i not in axes)
    return b.call("squeeze", [x], {"axes": list(axes)}, dtype=x.dtype, shape=shape)


def unsqueeze(b: Builder, x: Value, axes: Sequence[int]) -> Value:
    shape = list(dims_of(x))
    for a in sorted(axes):
        shape.insert(a, 1)
    if any(isinstance(d, SymDim) for d in shape):  # tract 0.23 mis-broadcasts unsqueezed symbolic ranges
        return b.call("reshape", [x], {"shape": shape}, dtype=x.dtype, shape=tuple(shape))
    return b.call("unsqueeze", [x], {"axes": list(axes)}, dtype=x.dtype, shape=tuple(shape))


def scalar_of(value: float | int | bool, dtype: torch.dtype, rank: int) -> Operand:
    """``value`` as an operand of ``dtype``: an f32/bool literal, else a one-element constant.

    tract reads integer literals as symbolic dims (TDim), so other dtypes get a tiny tensor.
    """
    if dtype == torch.float32:
        return float(value)
    if dtype == torch.bool:
        return bool(value)
    return constant(torch.full([1] * rank, value, dtype=dtype))


def broadcast_to(b: Builder, x: Operand, shape: Sequence[int], dtype: torch.dtype) -> Value:
    """``x`` broadcast to ``shape`` without materialising a full-size weight."""
    if isinstance(x, Value) and x.is_const and x.const.dim() == 0:
        x = scalar_of(x.const.item(), dtype, len(shape))
    if isinstance(x, Value):
        if dims_of(x) == tuple(shape):
            return x
        x = unsqueeze_to(b, x, len(shape))
    return b.call("tract_core_broadcast", [x], {"shape": list(shape)}, dtype=dtype, shape=tuple(shape))


def concat(b: Builder, parts: Sequence[Value], axis: int) -> Value:
    if len(parts) == 1:
        return parts[0]
    shape = list(dims_of(parts[0]))
    shape[axis] = sum(dims_of(p)[axis] for p in parts)
    return b.call("concat", [list(parts)], {"axis": axis}, dtype=parts[0].dtype, shape=tuple(shape))


@rule("aten::slice.Tensor")
def slice_(b: Builder, x: Value, dim: int, start: int | None, end: int | None, step: int) -> Value:
    """slice.Tensor(Tensor(a) self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor(a)"""  # noqa: E501
    if step < 1:
        raise LoweringError(f"slice step must be positive (torch forbids others), got {step}")
    dim = normalize_dim(dim, x.rank)
    n = dims_of(x)[dim]
    lo, hi = clamp_index(start, n, 0), clamp_index(end, n, n)
    if isinstance(n, int) and isinstance(hi, SymDim) and hi.symbol is not None:
        # a dim of n sliced to a size (a position table to T): the graph holds for T <= n only
        b.assume_at_most(hi.symbol, n, f"a dim of {n} is sliced to {hi.symbol}")
    if step > 1 and isinstance(lo, int) and isinstance(hi, int) and hi - lo <= step:
        # one element at most: a unit step reads the same, and tract's declutter fails on a strided
        # slice of a length-1 axis added by unsqueeze ("Invalid axis")
        step, hi = 1, min(hi, lo + 1)
    return slice_dim(b, x, dim, lo, hi, step)


@rule("aten::select.int")
def select(b: Builder, x: Value, dim: int, index: int) -> Value:
    """select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)"""
    dim = normalize_dim(dim, x.rank)
    n = dims_of(x)[dim]
    if isinstance(n, SymDim) or isinstance(index, SymDim):
        index = n + index if isinstance(index, int) and index < 0 else index
    elif not -n <= index < n:
        raise LoweringError(f"select index {index} out of range for dim {dim} of size {n}")
    else:
        index %= n
    out = squeeze(b, slice_dim(b, x, dim, index, index + 1), [dim])
    if x.series is not None and x.rank == 1:  # an element of a range over sizes is a size
        out = replace(out, series=(x.series[0] + index * x.series[1], 0))
    return out


@rule("aten::narrow")
def narrow(b: Builder, x: Value, dim: int, start: int | Value, length: int) -> Value:
    """narrow(Tensor(a) self, int dim, SymInt start, SymInt length) -> Tensor(a)"""
    if isinstance(start, Value):
        if not start.is_const:
            raise LoweringError("narrow: start must be known at export time (got a graph tensor)")
        start = int(start.const.item())
    dim = normalize_dim(dim, x.rank)
    n = dims_of(x)[dim]
    start = start + n if isinstance(start, int) and start < 0 else start
    return slice_dim(b, x, dim, start, start + length)


@rule("aten::expand")
def expand(b: Builder, x: Value, size: Sequence[int], implicit: bool) -> Value:
    """expand(Tensor(a) self, SymInt[] size, *, bool implicit=False) -> Tensor(a)"""
    src = (1,) * (len(size) - x.rank) + dims_of(x)
    target = [s if isinstance(t, int) and t == -1 else t for s, t in zip(src, size, strict=True)]
    return broadcast_to(b, x, target, x.dtype)


@rule("aten::expand_as")
def expand_as(b: Builder, x: Value, other: Value) -> Value:
    """expand_as(Tensor(a) self, Tensor other) -> Tensor(a)"""
    return broadcast_to(b, x, dims_of(other), x.dtype)


@rule("aten::repeat")
def repeat(b: Builder, x: Value, repeats: Sequence[int]) -> Value:
    """repeat(Tensor self, SymInt[] repeats) -> Tensor"""
    if len(repeats) < x.rank:
        raise LoweringError(f"repeat: {len(repeats)} repeats for a rank-{x.rank} tensor (need >= rank)")
    return _tile(b, x, [r if isinstance(r, SymDim) else int(r) for r in repeats])


@rule("aten::tile")
def tile(b: Builder, x: Value, dims: Sequence[int]) -> Value:
    """tile(Tensor self, SymInt[] dims) -> Tensor"""
    reps = [1] * (x.rank - len(dims)) + [int(d) for d in dims]
    return _tile(b, x, reps)


def _tile(b: Builder, x: Value, reps: list[int]) -> Value:
    x = unsqueeze_to(b, x, len(reps))
    if all(isinstance(r, int) and r == 1 for r in reps):
        return x
    shape = tuple(d * r for d, r in zip(dims_of(x), reps, strict=True))
    return b.call("tile", [x], {"repeats": reps}, dtype=x.dtype, shape=shape)


@rule("aten::roll")
def roll(b: Builder, x: Value, shifts: Sequence[int], dims: Sequence[int]) -> Value:
    """roll(Tensor self, SymInt[1] shifts, int[1] dims=[]) -> Tensor"""
    if not dims:
        if len(shifts) != 1:
            raise LoweringError(f"roll without dims takes one shift, got {list(shifts)}")
        shape = dims_of(x)
        flat = reshape(b, x, [int(torch.Size(shape).numel())])
        return reshape(b, _roll(b, flat, int(shifts[0]), 0), shape)
    if len(shifts) != len(dims):
        raise LoweringError(f"roll: {len(shifts)} shifts for {len(dims)} dims")
    for shift, dim in zip(shifts, dims, strict=True):
        x = _roll(b, x, int(shift), normalize_dim(dim, x.rank))
    return x


def _roll(b: Builder, x: Value, shift: int, dim: int) -> Value:
    n = dims_of(x)[dim]
    shift %= n
    if shift == 0:
        return x
    return concat(b, [slice_dim(b, x, dim, n - shift, n), slice_dim(b, x, dim, 0, n - shift)], dim)


@rule("aten::flip")
def flip(b: Builder, x: Value, dims: Sequence[int]) -> Value:
    """flip(Tensor self, int[] dims) -> Tensor"""
    # tract's slice has no negative stride (it aborts): gather with reversed indices instead
    for dim in sorted({normalize_dim(d, x.rank) for d in dims}):
        n = dims_of(x)[dim]
        if n > 1:
            x = gather_axis(b, x, constant(torch.arange(n - 1, -1, -1)), dim)
    return x


def gather_axis(b: Builder, x: Value, index: Value, axis: int) -> Value:
    """``tract_core_gather``: output shape is ``x.shape[:axis] + index.shape + x.shape[axis+1:]``."""
    shape = dims_of(x)
    out = (*shape[:axis], *dims_of(index), *shape[axis + 1 :])
    return b.call("tract_core_gather", [x, index], {"axis": axis}, dtype=x.dtype, shape=out)


def _split(b: Builder, x: Value, sizes: Sequence[int], dim: int) -> list[Value]:
    dim = normalize_dim(dim, x.rank)
    n = dims_of(x)[dim]
    if sum(sizes) != n:
        raise LoweringError(f"split sizes {list(sizes)} do not add up to dim {dim} of size {n}")
    out, start = [], 0
    for size in sizes:
        out.append(slice_dim(b, x, dim, start, start + int(size)))
        start += int(size)
    return out


def _even_sizes(n: int, size: int) -> list[int]:
    return [size] * (n // size) + ([n % size] if n % size else []) if n else [0]


@rule("aten::split.Tensor", "aten::unsafe_split.Tensor")
def split(b: Builder, x: Value, split_size: int, dim: int) -> list[Value]:
    """split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[]"""
    n = dims_of(x)[normalize_dim(dim, x.rank)]
    return _split(b, x, _even_sizes(n, int(split_size)), dim)


@rule("aten::split_with_sizes", "aten::unsafe_split_with_sizes", "aten::split.sizes")
def split_with_sizes(b: Builder, x: Value, split_sizes: Sequence[int], dim: int) -> list[Value]:
    """split_with_sizes(Tensor(a -> *) self, SymInt[] split_sizes, int dim=0) -> Tensor(a)[]"""
    return _split(b, x, split_sizes, dim)


@rule("aten::chunk", "aten::unsafe_chunk")
def chunk(b: Builder, x: Value, chunks: int, dim: int) -> list[Value]:
    """chunk(Tensor(a -> *) self, int chunks, int dim=0) -> Tensor(a)[]"""
    n = dims_of(x)[normalize_dim(dim, x.rank)]
    return _split(b, x, _even_sizes(n, -(-n // int(chunks))), dim)


@rule("aten::unbind.int")
def unbind(b: Builder, x: Value, dim: int) -> list[Value]:
    """unbind.int(Tensor(a -> *) self, int dim=0) -> Tensor(a)[]"""
    dim = normalize_dim(dim, x.rank)
    return [select(b, x, dim, i) for i in range(dims_of(x)[dim])]


@rule("aten::stack")
def stack(b: Builder, tensors: Sequence[Value], dim: int) -> Value:
    """stack(Tensor[] tensors, int dim=0) -> Tensor"""
    first = tensors[0]
    dim = normalize_dim(dim, first.rank + 1)  # a new axis: negative dims count from rank + 1
    shape = list(dims_of(first))
    shape.insert(dim, len(tensors))
    if first.rank == 0:  # tract's stack wants tensors: scalars become [1] and are concatenated
        return concat(b, [reshape(b, t, [1]) for t in tensors], 0)
    return b.call("stack", [list(tensors)], {"axis": dim}, dtype=first.dtype, shape=tuple(shape))


@rule("aten::movedim.int", "aten::moveaxis.int")
def movedim(b: Builder, x: Value, source: int, destination: int) -> Value:
    """movedim.int(Tensor(a) self, int source, int destination) -> Tensor(a)"""
    return movedim_list(b, x, [source], [destination])


@rule("aten::movedim.intlist", "aten::moveaxis.intlist")
def movedim_list(b: Builder, x: Value, source: Sequence[int], destination: Sequence[int]) -> Value:
    """movedim.intlist(Tensor(a) self, int[] source, int[] destination) -> Tensor(a)"""
    rank = x.rank
    src = [normalize_dim(s, rank) for s in source]
    dst = [normalize_dim(d, rank) for d in destination]
    perm: list[int | None] = [None] * rank
    for s, d in zip(src, dst, strict=True):
        perm[d] = s
    rest = iter(i for i in range(rank) if i not in src)
    return transpose(b, x, [p if p is not None else next(rest) for p in perm])


@rule("aten::unflatten.int")
def unflatten(b: Builder, x: Value, dim: int, sizes: Sequence[int]) -> Value:
    """unflatten.int(Tensor(a) self, int dim, SymInt[] sizes) -> Tensor(a)"""
    shape = list(dims_of(x))
    dim = normalize_dim(dim, len(shape))
    sizes = [s if isinstance(s, SymDim) else int(s) for s in sizes]
    if -1 in sizes:
        known = 1
        for s in sizes:
            known = known * s if s != -1 else known
        sizes[sizes.index(-1)] = shape[dim] // known
    return reshape(b, x, shape[:dim] + sizes + shape[dim + 1 :])


@rule("aten::pixel_shuffle")
def pixel_shuffle(b: Builder, x: Value, upscale_factor: int) -> Value:
    """pixel_shuffle(Tensor self, int upscale_factor) -> Tensor"""
    r = int(upscale_factor)
    *batch, c, h, w = dims_of(x)
    k = len(batch)
    y = reshape(b, x, [*batch, c // (r * r), r, r, h, w])
    y = transpose(b, y, [*range(k), k, k + 3, k + 1, k + 4, k + 2])
    return reshape(b, y, [*batch, c // (r * r), h * r, w * r])


@rule("aten::pixel_unshuffle")
def pixel_unshuffle(b: Builder, x: Value, downscale_factor: int) -> Value:
    """pixel_unshuffle(Tensor self, int downscale_factor) -> Tensor"""
    r = int(downscale_factor)
    *batch, c, h, w = dims_of(x)
    k = len(batch)
    y = reshape(b, x, [*batch, c, h // r, r, w // r, r])
    y = transpose(b, y, [*range(k), k, k + 2, k + 4, k + 1, k + 3])
    return reshape(b, y, [*batch, c * r * r, h // r, w // r])

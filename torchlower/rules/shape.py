"""Shape and layout: reshape/view/flatten, permutations, squeeze/unsqueeze, cat, identities, casts.

Shapes are known from the front end; rules keep symbolic dims symbolic (``0`` = copy the input
dim, ``-1`` = infer) instead of baking observed sizes, and identities emit nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchlower.core.values import Dim, SymDim, Value, constant, counted, normalize_dim
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder, cast, shape_of


@rule("aten::reshape", "aten::view", "aten::_unsafe_view")
def reshape(b: Builder, x: Value, shape: Sequence[Any]) -> Value:
    """reshape(Tensor(a) self, SymInt[] shape) -> Tensor(a)  (also view, _unsafe_view)"""
    target = _target_shape(shape_of(x), [_dim(d) for d in shape])
    if tuple(target) == tuple(shape_of(x)):
        return x
    if not target:  # tract cannot read `shape = []`; every dim is 1, so squeeze them all
        return b.call("squeeze", [x], {"axes": list(range(x.rank))}, dtype=x.dtype, shape=())
    return b.call("reshape", [x], {"shape": target}, dtype=x.dtype, shape=_counted_shape(x, target))


def _counted_shape(x: Value, target: Sequence[Any]) -> tuple[Any, ...] | None:
    """The result's shape when ``x`` holds a size counted at run time (``nonzero``'s): the front
    end saw the example's count, so ``-1`` is solved here and the count stays a symbol."""
    source = shape_of(x)
    if not any(counted(d) for d in source):
        return None
    total: Any = 1
    for d in source:
        total = total * d
    known: Any = 1
    for d in target:
        known = known * d if not (isinstance(d, int) and d == -1) else known
    return tuple(total // known if isinstance(d, int) and d == -1 else d for d in target)


@rule("aten::reshape_as", "aten::view_as")
def reshape_as(b: Builder, x: Value, other: Value) -> Value:
    """reshape_as(Tensor(a) self, Tensor other) -> Tensor(a)  (also view_as)"""
    return reshape(b, x, list(shape_of(other)))


@rule("aten::_reshape_alias")
def reshape_alias(b: Builder, x: Value, size: Sequence[Any], stride: Sequence[int]) -> Value:
    """_reshape_alias(Tensor(a) self, SymInt[] size, SymInt[] stride) -> Tensor(a)

    Limits: contiguous strides only (a plain reshape); other strides would be an as_strided view.
    """
    dims = [int(d) for d in size]
    contiguous = [1] * len(dims)
    for i in range(len(dims) - 2, -1, -1):
        contiguous[i] = contiguous[i + 1] * max(dims[i + 1], 1)
    if [int(s) for s in stride] != contiguous:
        raise LoweringError(f"_reshape_alias: stride must be contiguous {contiguous}, got {list(stride)}")
    return reshape(b, x, size)


@rule("aten::flatten.using_ints")
def flatten(b: Builder, x: Value, start_dim: int, end_dim: int) -> Value:
    """flatten.using_ints(Tensor(a) self, int start_dim=0, int end_dim=-1) -> Tensor(a)"""
    if x.rank == 0:
        return b.call("reshape", [x], {"shape": [1]}, dtype=x.dtype, shape=(1,))
    start, end = normalize_dim(start_dim, x.rank), normalize_dim(end_dim, x.rank)
    if start >= end:
        return x
    dims = shape_of(x)
    merged: Dim = -1
    if all(isinstance(d, int) for d in dims[start : end + 1]):
        merged = 1
        for d in dims[start : end + 1]:
            merged *= int(d)
    out = (*dims[:start], merged, *dims[end + 1 :])
    attrs = {"shape": [merged], "axis_start": start, "axis_count": end - start + 1}
    return b.call("reshape", [x], attrs, dtype=x.dtype, shape=out if merged != -1 else None)


@rule("aten::permute")
def permute(b: Builder, x: Value, dims: Sequence[int]) -> Value:
    """permute(Tensor(a) self, int[] dims) -> Tensor(a)"""
    axes = [normalize_dim(d, x.rank) for d in dims]
    if axes == sorted(axes):
        return x
    shape = tuple(shape_of(x)[a] for a in axes)
    return b.call("transpose", [x], {"axes": axes}, dtype=x.dtype, shape=shape)


@rule("aten::transpose.int")
def transpose(b: Builder, x: Value, dim0: int, dim1: int) -> Value:
    """transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a)"""
    if x.rank < 2:
        return x
    axes = list(range(x.rank))
    i, j = normalize_dim(dim0, x.rank), normalize_dim(dim1, x.rank)
    axes[i], axes[j] = axes[j], axes[i]
    return permute(b, x, axes)


@rule("aten::t", "aten::numpy_T")
def t(b: Builder, x: Value) -> Value:
    """t(Tensor(a) self) -> Tensor(a)"""
    return permute(b, x, list(reversed(range(x.rank))))


@rule("aten::squeeze")
def squeeze(b: Builder, x: Value, dim: int | Sequence[int] | None = None) -> Value:
    """squeeze(Tensor(a) self) / squeeze.dim(self, int dim) / squeeze.dims(self, int[] dim)

    Like torch, a named dim whose size is not 1 is left alone.
    """
    dims = range(x.rank) if dim is None else [dim] if isinstance(dim, int) else dim
    shape = shape_of(x)
    axes = sorted({normalize_dim(d, x.rank) for d in dims} if x.rank else set())
    axes = [a for a in axes if shape[a] == 1]
    if not axes:
        return x
    out = tuple(d for i, d in enumerate(shape) if i not in axes)
    return b.call("squeeze", [x], {"axes": axes}, dtype=x.dtype, shape=out)


@rule("aten::unsqueeze")
def unsqueeze(b: Builder, x: Value, dim: int) -> Value:
    """unsqueeze(Tensor(a) self, int dim) -> Tensor(a)"""
    axis = normalize_dim(dim, x.rank + 1)
    shape = list(shape_of(x))
    shape.insert(axis, 1)
    if any(isinstance(d, SymDim) for d in shape):  # tract 0.23 mis-broadcasts unsqueezed symbolic ranges
        return b.call("reshape", [x], {"shape": shape}, dtype=x.dtype, shape=tuple(shape))
    return b.call("unsqueeze", [x], {"axes": [axis]}, dtype=x.dtype, shape=tuple(shape))


@rule("aten::cat", "aten::concat", "aten::concatenate")
def cat(b: Builder, tensors: Sequence[Value], dim: int) -> Value:
    """cat(Tensor[] tensors, int dim=0) -> Tensor

    Legacy empty 1-D operands are skipped; mixed dtypes are promoted like torch does.
    """
    parts = [v for v in tensors if not (v.rank == 1 and shape_of(v)[0] == 0)]
    if parts and parts[0].rank > 1:  # empty pieces (an empty slice is an empty constant)
        axis = normalize_dim(dim, parts[0].rank)
        parts = [v for v in parts if not (v.is_const and v.const.shape[axis] == 0)] or parts[:1]
    if not parts:
        return tensors[0]
    rank = parts[0].rank
    axis = normalize_dim(dim, rank)
    dtype = parts[0].dtype
    for v in parts[1:]:
        dtype = torch.promote_types(dtype, v.dtype) if dtype and v.dtype else dtype
    parts = [cast(b, v, dtype) if dtype is not None else v for v in parts]
    if len(parts) == 1:
        return parts[0]
    shape = None
    if all(v.shape is not None for v in parts):  # a counted size (nonzero's) stays symbolic
        shape = (*parts[0].shape[:axis], sum(v.shape[axis] for v in parts), *parts[0].shape[axis + 1 :])
    return b.call("concat", [parts], {"axis": axis}, dtype=dtype, shape=shape)


@rule(
    "aten::contiguous",
    "aten::clone",
    "aten::detach",
    "aten::detach_",
    "aten::lift_fresh",
    "aten::lift_fresh_copy",
    "aten::alias",
)
def identity(b: Builder, x: Value, memory_format: object = None) -> Value:
    """contiguous(Tensor(a) self, *, MemoryFormat memory_format=contiguous_format) -> Tensor(a)

    Layout-only or autograd-only ops: the value is unchanged.
    """
    return x


@rule("aten::dropout", "aten::feature_dropout", "aten::alpha_dropout", "aten::feature_alpha_dropout",
      "aten::dropout_", "aten::feature_dropout_", "aten::alpha_dropout_",
      "aten::feature_alpha_dropout_")  # fmt: skip
def dropout(b: Builder, x: Value, p: float, train: bool | None) -> Value:
    """dropout(Tensor input, float p, bool train) -> Tensor: identity in eval."""
    if train and p > 0:
        raise LoweringError(
            "dropout: train=True cannot be exported; call model.eval() (expected train=False)"
        )
    return x


@rule("aten::to.dtype")
def to_dtype(
    b: Builder, x: Value, dtype: torch.dtype, non_blocking: bool, copy: bool, memory_format: object
) -> Value:
    """to.dtype(Tensor(a) self, ScalarType dtype, bool non_blocking=False, bool copy=False, ...)"""
    return cast(b, x, dtype)


@rule("aten::to.device")
def to_device(
    b: Builder,
    x: Value,
    device: object,
    dtype: torch.dtype,
    non_blocking: bool,
    copy: bool,
    memory_format: object,
) -> Value:
    """to.device(Tensor(a) self, Device device, ScalarType dtype, bool non_blocking=False, ...)"""
    return cast(b, x, dtype)


@rule("aten::to.other")
def to_other(
    b: Builder, x: Value, other: Value, non_blocking: bool, copy: bool, memory_format: object
) -> Value:
    """to.other(Tensor(a) self, Tensor other, bool non_blocking=False, bool copy=False, ...)"""
    return cast(b, x, other.dtype) if other.dtype is not None else x


@rule("aten::to.dtype_layout")
def to_dtype_layout(
    b: Builder,
    x: Value,
    dtype: torch.dtype | None,
    layout: object = None,
    device: object = None,
    pin_memory: object = None,
    non_blocking: bool = False,
    copy: bool = False,
    memory_format: object = None,
) -> Value:
    """to.dtype_layout(Tensor(a) self, *, ScalarType? dtype=None, Layout? layout=None, ...)"""
    return x if dtype is None else cast(b, x, dtype)


@rule("aten::_to_copy")
def to_copy(
    b: Builder,
    x: Value,
    dtype: torch.dtype | None,
    layout: object = None,
    device: object = None,
    pin_memory: object = None,
    non_blocking: bool = False,
    memory_format: object = None,
) -> Value:
    """_to_copy(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, ...)"""
    return x if dtype is None else cast(b, x, dtype)


@rule("aten::type_as")
def type_as(b: Builder, x: Value, other: Value) -> Value:
    """type_as(Tensor self, Tensor other) -> Tensor"""
    return cast(b, x, other.dtype) if other.dtype is not None else x


@rule("aten::size")
def size(b: Builder, x: Value, dim: int | None = None) -> Any:
    """size.int(Tensor self, int dim) -> int / size(Tensor self) -> int[]: observed sizes."""
    shape = shape_of(x)
    return list(shape) if dim is None else shape[normalize_dim(dim, x.rank)]


@rule("aten::numel")
def numel(b: Builder, x: Value) -> Dim:
    """numel(Tensor self) -> int: the product of the observed (possibly symbolic) sizes."""
    count: Dim = 1
    for d in shape_of(x):
        count = count * d
    return count


@rule("aten::_shape_as_tensor")
def shape_as_tensor(b: Builder, x: Value) -> Value:
    """_shape_as_tensor(Tensor self) -> Tensor: the sizes as an i64 vector (symbolic ones read
    from the tensor at run time with ``tract_core_shape_of``)."""
    shape = shape_of(x)
    if all(isinstance(d, int) for d in shape):
        return constant(torch.tensor([int(d) for d in shape], dtype=torch.int64))
    sizes = b.call("tract_core_shape_of", [x], dtype=torch.int64, shape=(len(shape),))
    return b.call("tract_core_cast", [sizes], {"to": "i64"}, dtype=torch.int64, shape=(len(shape),))


def _dim(d: Any) -> Dim:
    if isinstance(d, Value) and d.is_const:
        return int(d.const.item())
    if isinstance(d, str):
        return SymDim(d)
    if isinstance(d, (int, SymDim)):
        return d
    raise LoweringError(f"reshape: expected int or symbolic dims, got {d!r}")


def _target_shape(src: Sequence[Dim], dst: Sequence[Dim]) -> list[Dim]:
    """Resolve ``-1`` when everything is static; otherwise copy matching symbolic dims with 0."""
    if all(isinstance(d, int) for d in (*src, *dst)):
        total = 1
        for d in src:
            total *= int(d)
        known = 1
        for d in dst:
            known *= int(d) if d != -1 else 1
        return [total // known if d == -1 else d for d in dst]
    # symbolic: a dim equal to the input's at the same position is copied (0); other
    # expressions print in tract's TDim syntax, which reshape accepts
    return [0 if not isinstance(d, int) and i < len(src) and src[i] == d else d for i, d in enumerate(dst)]

"""Indexing: gather, index_select, advanced indexing, index_put, scatter, masked ops, where.

Advanced indexing (``x[i, :, j]``) follows PyTorch exactly: index tensors broadcast together;
their result dims replace the indexed dims in place when those are adjacent, else lead.
One index tensor becomes ``tract_core_gather``; several become ``tract_core_gather_nd`` on a
transposed input. Boolean indices have data-dependent shapes, so they are lowered only when
known at export time (or, for ``index_put``, as a ``select`` — no shape change needed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from torchlower.core.dynamic import materialize
from torchlower.core.values import Dim, Value, constant, normalize_dim
from torchlower.errors import LoweringError
from torchlower.rules import masks, rule
from torchlower.rules.common import Builder, Operand, align_ranks, broadcast_shapes, reshape, unsqueeze_to
from torchlower.rules.layout import (
    broadcast_to,
    concat,
    dims_of,
    gather_axis,
    scalar_of,
    slice_dim,
    transpose,
    unsqueeze,
)

Scalar = float | int | bool


def cast(b: Builder, x: Value, dtype: torch.dtype) -> Value:
    if x.dtype == dtype:
        return x
    if x.is_const:
        return constant(x.const.to(dtype))
    return b.call("tract_core_cast", [x], {"to": b.dtype_name(dtype)}, dtype=dtype, shape=x.shape)


def _int_like(value: int, dtype: torch.dtype, rank: int) -> Value:
    return constant(torch.full([1] * rank, value, dtype=dtype))


def wrap_negative(b: Builder, index: Value, n: Dim) -> Value:
    """Negative indices counted from the end, for tract ops that read them as unsigned."""
    if index.is_const and not bool((index.const < 0).any()):
        return index
    if index.is_const and isinstance(n, int):
        return constant(torch.where(index.const < 0, index.const + n, index.const))
    r, dt = index.rank, index.dtype
    neg = b.call("lt", [index, _int_like(0, dt, r)], dtype=torch.bool, shape=index.shape)
    size = _int_like(n, dt, r) if isinstance(n, int) else reshape(b, cast(b, materialize(b, n), dt), [1] * r)
    shifted = b.call("add", [index, size], dtype=dt, shape=index.shape)
    return b.call("select", [neg, shifted, index], dtype=dt, shape=index.shape)


# ---- advanced indexing plan -------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """How ``x[indices]`` maps onto gather_nd / scatter_nd over a transposed ``x``."""

    dims: list[int]  # indexed dims of x, in order
    perm: list[int]  # x transposed so indexed dims lead
    broadcast: tuple[int, ...]  # shape B of the broadcast index tensors
    result_perm: list[int]  # [B..., rest...] → torch's result layout
    result_shape: tuple[int, ...]


def plan(x: Value, indices: Sequence[Value]) -> Plan:
    shape = dims_of(x)
    dims = [d for d, i in enumerate(indices) if i is not None]
    rest = [d for d in range(len(shape)) if d not in dims]
    bshape = broadcast_shapes(*[dims_of(indices[d]) for d in dims])
    nb = len(bshape)
    rest_shape = [shape[d] for d in rest]
    adjacent = dims == list(range(dims[0], dims[-1] + 1))
    before = dims[0] if adjacent else 0  # rest dims that stay in front of B
    result_perm = [nb + i for i in range(before)] + list(range(nb)) + list(range(nb + before, nb + len(rest)))
    full = [*bshape, *rest_shape]
    return Plan(dims, dims + rest, bshape, result_perm, tuple(full[p] for p in result_perm))


def expand_bool_indices(indices: Sequence[Value | None], what: str) -> list[Value | None]:
    """Constant boolean masks become the integer indices of their True entries."""
    out: list[Value | None] = []
    for index in indices:
        if index is not None and index.dtype in (torch.bool, torch.uint8):
            if not index.is_const:
                raise LoweringError(
                    f"{what}: a boolean index computed in the graph gives a data-dependent shape; "
                    "tract needs it known at export time (use torch.where / masked_fill instead)"
                )
            out += [constant(t) for t in torch.nonzero(index.const.bool(), as_tuple=True)]
        else:
            out.append(index)
    return out


def stacked_indices(b: Builder, x: Value, p: Plan, indices: Sequence[Value]) -> Value:
    """The ``[*B, k]`` int64 index tensor of gather_nd / scatter_nd (non-negative)."""
    shape = dims_of(x)
    parts = [wrap_negative(b, cast(b, indices[d], torch.int64), shape[d]) for d in p.dims]
    if all(i.is_const for i in parts):
        return constant(torch.stack(torch.broadcast_tensors(*[i.const for i in parts]), -1))
    parts = [broadcast_to(b, i, p.broadcast, torch.int64) for i in parts]
    return concat(b, [unsqueeze(b, i, [len(p.broadcast)]) for i in parts], len(p.broadcast))


@rule("aten::index.Tensor")
def index(b: Builder, x: Value, indices: Sequence[Value | None]) -> Value:
    """index.Tensor(Tensor self, Tensor?[] indices) -> Tensor"""
    if masks.graph_masks(indices):  # a data-dependent size (torch-geometric's edge_index[:, mask])
        return masks.index_by_mask(b, x, indices, "index")
    indices = expand_bool_indices(indices, "index")
    used = [d for d, i in enumerate(indices) if i is not None]
    if not used:
        return x
    if len(used) == 1:
        return gather_axis(b, x, indices[used[0]], used[0])  # tract_core_gather wraps negatives
    p = plan(x, indices)
    xt = transpose(b, x, p.perm)
    idx = stacked_indices(b, x, p, indices)
    rest = [dims_of(xt)[i] for i in range(len(p.dims), x.rank)]
    y = b.call(
        "tract_core_gather_nd", [xt, idx], {"batch_dims": 0}, dtype=x.dtype, shape=(*p.broadcast, *rest)
    )
    return transpose(b, y, p.result_perm)


@rule("aten::index_put", "aten::index_put_")
def index_put(
    b: Builder, x: Value, indices: Sequence[Value | None], values: Value, accumulate: bool
) -> Value:
    """index_put(Tensor self, Tensor?[] indices, Tensor values, bool accumulate=False) -> Tensor"""
    values = cast(b, values, x.dtype)
    masks = [d for d, i in enumerate(indices) if i is not None and i.dtype == torch.bool and not i.is_const]
    if masks:
        return _masked_put(b, x, indices, values, accumulate)
    indices = expand_bool_indices(indices, "index_put")
    if not any(i is not None for i in indices):
        raise LoweringError("index_put: no index tensor given")
    p = plan(x, indices)
    xt = transpose(b, x, p.perm)
    idx = stacked_indices(b, x, p, indices)
    inverse = [p.result_perm.index(i) for i in range(len(p.result_perm))]
    updates = transpose(b, broadcast_to(b, values, p.result_shape, x.dtype), inverse)
    reduction = "add" if accumulate else "none"
    y = b.call(
        "tract_core_scatter_nd", [xt, idx, updates], {"reduction": reduction}, dtype=x.dtype, shape=xt.shape
    )
    return transpose(b, y, [p.perm.index(i) for i in range(x.rank)])


def _masked_put(
    b: Builder, x: Value, indices: Sequence[Value | None], values: Value, accumulate: bool
) -> Value:
    """``x[mask] = v`` with one graph-computed mask and a single value: a ``select``."""
    used = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(used) != 1 or (values.shape is not None and int(torch.Size(dims_of(values)).numel()) != 1):
        raise LoweringError(
            "index_put with a graph-computed boolean mask is supported for a single mask and a single "
            "value (x[mask] = v); other forms have data-dependent shapes"
        )
    d, mask = used[0]
    mask = reshape(b, mask, [1] * d + list(dims_of(mask)) + [1] * (x.rank - d - mask.rank))
    value: Operand = values.const.item() if values.is_const else reshape(b, values, [1] * x.rank)
    if isinstance(value, (int, float, bool)):
        value = scalar_of(value, x.dtype, x.rank)
    if accumulate:
        zero = scalar_of(0, x.dtype, x.rank)
        value = b.call("add", [x, b.call("select", [mask, value, zero], dtype=x.dtype)], dtype=x.dtype)
    return b.call("select", [mask, value, x], dtype=x.dtype, shape=x.shape)


@rule("aten::index_select")
def index_select(b: Builder, x: Value, dim: int, index: Value) -> Value:
    """index_select(Tensor self, int dim, Tensor index) -> Tensor"""
    return gather_axis(b, x, index, normalize_dim(dim, x.rank))


@rule("aten::gather")
def gather(b: Builder, x: Value, dim: int, index: Value, sparse_grad: bool) -> Value:
    """gather(Tensor self, int dim, Tensor index, *, bool sparse_grad=False) -> Tensor"""
    dim = normalize_dim(dim, x.rank)
    return b.call("tract_core_gather_elements", [x, index], {"axis": dim}, dtype=x.dtype, shape=index.shape)


# ---- scatter ----------------------------------------------------------------------------


def _updates(b: Builder, src: Value | Scalar, index: Value, dtype: torch.dtype) -> Value:
    """torch reads only ``src[:index.shape]``; tract wants updates shaped like the index."""
    ishape = dims_of(index)
    if not isinstance(src, Value):
        return broadcast_to(b, scalar_of(src, dtype, len(ishape)), ishape, dtype)
    src = cast(b, src, dtype)
    for d, (n, m) in enumerate(zip(ishape, dims_of(src), strict=True)):
        if isinstance(n, int) and isinstance(m, int) and n < m:  # symbolic sizes: equal (torch_geometric)
            src = slice_dim(b, src, d, 0, n)
    return src


def scatter_elements(b: Builder, x: Value, dim: int, index: Value, upd: Value, reduction: str) -> Value:
    dim = normalize_dim(dim, x.rank)
    attrs = {"axis": dim, "reduction": reduction}
    return b.call("tract_core_scatter_elements", [x, index, upd], attrs, dtype=x.dtype, shape=x.shape)


_REDUCTIONS = {"sum": "add", "add": "add", "prod": "mul", "multiply": "mul", "amax": "max", "amin": "min"}


def _neutral(reduction: str, dtype: torch.dtype) -> Scalar:
    """The element a reduction starts from (±inf for floats, the int range ends otherwise)."""
    if reduction in ("add", "mul"):
        return int(reduction == "mul")
    if dtype.is_floating_point:
        return float("-inf") if reduction == "max" else float("inf")
    info = torch.iinfo(dtype)
    return int(info.min) if reduction == "max" else int(info.max)


def _reduction(reduce: str) -> str:
    if reduce not in _REDUCTIONS:
        raise LoweringError(f"scatter reduce={reduce!r}: expected one of {sorted(_REDUCTIONS)} or 'mean'")
    return _REDUCTIONS[reduce]


@rule("aten::scatter.src", "aten::scatter_.src")
def scatter(b: Builder, x: Value, dim: int, index: Value, src: Value) -> Value:
    """scatter.src(Tensor self, int dim, Tensor index, Tensor src) -> Tensor"""
    return scatter_elements(b, x, dim, index, _updates(b, src, index, x.dtype), "none")


@rule("aten::scatter.value", "aten::scatter_.value")
def scatter_value(b: Builder, x: Value, dim: int, index: Value, value: Scalar) -> Value:
    """scatter.value(Tensor self, int dim, Tensor index, Scalar value) -> Tensor"""
    return scatter_elements(b, x, dim, index, _updates(b, value, index, x.dtype), "none")


@rule("aten::scatter.reduce", "aten::scatter_.reduce")
def scatter_src_reduce(b: Builder, x: Value, dim: int, index: Value, src: Value, reduce: str) -> Value:
    """scatter.reduce(Tensor self, int dim, Tensor index, Tensor src, *, str reduce) -> Tensor"""
    return scatter_elements(b, x, dim, index, _updates(b, src, index, x.dtype), _reduction(reduce))


@rule("aten::scatter.value_reduce", "aten::scatter_.value_reduce")
def scatter_value_reduce(b: Builder, x: Value, dim: int, index: Value, value: Scalar, reduce: str) -> Value:
    """scatter.value_reduce(Tensor self, int dim, Tensor index, Scalar value, *, str reduce) -> Tensor"""
    return scatter_elements(b, x, dim, index, _updates(b, value, index, x.dtype), _reduction(reduce))


@rule("aten::scatter_add", "aten::scatter_add_")
def scatter_add(b: Builder, x: Value, dim: int, index: Value, src: Value) -> Value:
    """scatter_add(Tensor self, int dim, Tensor index, Tensor src) -> Tensor"""
    return scatter_elements(b, x, dim, index, _updates(b, src, index, x.dtype), "add")


@rule("aten::scatter_reduce.two", "aten::scatter_reduce_.two")
def scatter_reduce(
    b: Builder, x: Value, dim: int, index: Value, src: Value, reduce: str, include_self: bool
) -> Value:
    """scatter_reduce.two(Tensor self, int dim, Tensor index, Tensor src, str reduce, *, bool include_self=True) -> Tensor"""  # noqa: E501
    upd = _updates(b, src, index, x.dtype)
    if reduce == "mean":
        if not x.dtype.is_floating_point:
            raise LoweringError("scatter_reduce(reduce='mean') is lowered for floating-point tensors only")
        ones = broadcast_to(b, scalar_of(1, x.dtype, x.rank), dims_of(x), x.dtype)
        total = scatter_reduce(b, x, dim, index, upd, "sum", include_self)
        count = scatter_reduce(b, ones, dim, index, _updates(b, 1, index, x.dtype), "sum", include_self)
        return b.call("div", [total, count], dtype=x.dtype, shape=x.shape)
    reduction = _reduction(reduce)
    if not include_self:  # targeted slots start from the reduction's neutral element
        x = scatter_elements(
            b, x, dim, index, _updates(b, _neutral(reduction, x.dtype), index, x.dtype), "none"
        )
    return scatter_elements(b, x, dim, index, upd, reduction)


# ---- masks and where --------------------------------------------------------------------


def _value_operand(b: Builder, value: Value | Scalar, dtype: torch.dtype, rank: int) -> Operand:
    if isinstance(value, Value) and value.is_const and value.const.dim() == 0:
        value = value.const.item()
    if not isinstance(value, Value):
        return scalar_of(value, dtype, rank)
    return unsqueeze_to(b, cast(b, value, dtype), rank)


@rule(
    "aten::masked_fill.Scalar",
    "aten::masked_fill_.Scalar",
    "aten::masked_fill.Tensor",
    "aten::masked_fill_.Tensor",
)
def masked_fill(b: Builder, x: Value, mask: Value, value: Value | Scalar) -> Value:
    """masked_fill.Scalar(Tensor self, Tensor mask, Scalar value) -> Tensor"""
    # the fill value stays a scalar literal (or a one-element tensor): no full-size weight
    mask, x = align_ranks(b, cast(b, mask, torch.bool), x)
    v = _value_operand(b, value, x.dtype, x.rank)
    return b.call("select", [mask, v, x], dtype=x.dtype)


def _promote(dtype: torch.dtype, scalar: Value | Scalar) -> torch.dtype:
    """torch's rule for a tensor and a Python scalar: a float scalar makes int tensors float."""
    if isinstance(scalar, float) and not dtype.is_floating_point:
        return torch.get_default_dtype()
    if isinstance(scalar, int) and not isinstance(scalar, bool) and dtype == torch.bool:
        return torch.int64
    return dtype


def where_(b: Builder, cond: Value, a: Value | Scalar, c: Value | Scalar) -> Value:
    tensors = [t for t in (a, c) if isinstance(t, Value)]
    if len(tensors) == 2:
        dtype = torch.promote_types(a.dtype, c.dtype)  # type: ignore[union-attr]
    elif tensors:
        dtype = _promote(tensors[0].dtype, c if tensors[0] is a else a)
    else:
        dtype = torch.float32 if any(isinstance(s, float) for s in (a, c)) else torch.int64
        if all(isinstance(s, bool) for s in (a, c)):
            dtype = torch.bool
    rank = max([cond.rank, *(t.rank for t in tensors)])
    ops = [_value_operand(b, t, dtype, rank) for t in (a, c)]
    cond = unsqueeze_to(b, cast(b, cond, torch.bool), rank)
    return b.call("select", [cond, *ops], dtype=dtype)


@rule("aten::where.self", "aten::where.ScalarSelf", "aten::where.ScalarOther", "aten::where.Scalar")
def where(b: Builder, condition: Value, x: Value | Scalar, other: Value | Scalar) -> Value:
    """where.self(Tensor condition, Tensor self, Tensor other) -> Tensor"""
    return where_(b, condition, x, other)

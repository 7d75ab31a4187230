"""Data-dependent sizes: ``nonzero``, boolean-mask indexing and ``masked_select`` on masks
computed in the graph, through tract's ``tract_onnx_non_zero`` (registry ``tract_onnx``; load
such an archive with ``tract.nnef().with_onnx()``). Its element count is a free symbol tract
binds when the op runs, so the same archive serves every mask.

torch-geometric's self-loop removal ``edge_index[:, edge_index[0] != edge_index[1]]`` (GCN,
GAT) is one 1-D mask on one axis: a ``tract_core_gather`` of the mask's positions. ``unique``
has no tract op: it is refused with a typed error naming the line.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torchlower.core.values import COUNTED, SymDim, Value, constant
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder, broadcast_shapes, cast, reshape
from torchlower.rules.layout import broadcast_to, dims_of

ONNX = "tract_registry tract_onnx"


def _non_zero(b: Builder, x: Value) -> Value:
    """``[rank, count]`` int64 coordinates of ``x``'s non-zero elements, in row-major order."""
    b.use_extension(ONNX)
    count = b.fresh(COUNTED)  # tract's symbol for the count: layout passes see a size, not a 1
    b.use_extension(f"tract_symbol {count}")  # declared: sizes computed from it name it
    return b.call(
        "tract_onnx_non_zero", [x], {"count_symbol": count}, dtype=torch.int64, shape=(x.rank, SymDim(count))
    )


def mask_positions(b: Builder, mask: Value) -> Value:
    """The flat positions of a mask's True elements: ``[count]`` int64 (``count`` read at run time)."""
    flat = reshape(b, mask, [-1]) if mask.rank != 1 else mask
    coords = _non_zero(b, flat)
    return b.call("squeeze", [coords], {"axes": [0]}, dtype=torch.int64, shape=coords.shape[1:])


def select_by_mask(b: Builder, x: Value, mask: Value, dim: int) -> Value:
    """``x[:, …, mask]`` with a graph-computed boolean ``mask`` over ``x``'s dims ``dim…``."""
    shape = dims_of(x)
    n = mask.rank
    if list(dims_of(mask)) != list(shape[dim : dim + n]):
        raise LoweringError(
            f"index: a boolean mask of shape {list(dims_of(mask))} must match the indexed dims "
            f"{list(shape[dim : dim + n])} of the tensor"
        )
    if n != 1:  # the masked dims merged into one, as torch's result lays them out
        x = reshape(b, x, [*shape[:dim], -1, *shape[dim + n :]])
    picks = mask_positions(b, mask)
    out = (*shape[:dim], *dims_of(picks), *shape[dim + n :])
    return b.call("tract_core_gather", [x, picks], {"axis": dim}, dtype=x.dtype, shape=out)


def graph_masks(indices: Sequence[Value | None]) -> list[int]:
    """Positions of boolean index tensors computed in the graph (not known at export time)."""
    return [
        d
        for d, i in enumerate(indices)
        if i is not None and i.dtype in (torch.bool, torch.uint8) and not i.is_const
    ]


def index_by_mask(b: Builder, x: Value, indices: Sequence[Value | None], what: str) -> Value:
    """``x[..., mask, ...]``: one graph-computed mask and no other index tensor."""
    masks = graph_masks(indices)
    others = [d for d, i in enumerate(indices) if i is not None and d not in masks]
    if len(masks) != 1 or others:
        raise LoweringError(
            f"{what}: a boolean mask computed in the graph is supported alone (x[mask], x[:, mask]); "
            "with other index tensors the result's layout depends on the mask (index one at a time)"
        )
    d = masks[0]
    return select_by_mask(b, x, cast(b, indices[d], torch.bool), d)


@rule("aten::nonzero")
def nonzero(b: Builder, x: Value) -> Value:
    """nonzero(Tensor self) -> Tensor"""
    coords = _non_zero(b, x)
    return b.call("transpose", [coords], {"axes": [1, 0]}, dtype=torch.int64, shape=coords.shape[::-1])


@rule("aten::masked_select")
def masked_select(b: Builder, x: Value, mask: Value) -> Value:
    """masked_select(Tensor self, Tensor mask) -> Tensor"""
    shape = broadcast_shapes(dims_of(x), dims_of(mask))
    flat = reshape(b, broadcast_to(b, x, shape, x.dtype), [-1])
    if mask.is_const:  # known at export time: the picks are a constant, the size static
        picks = torch.nonzero(mask.const.bool().expand(shape).reshape(-1)).reshape(-1)
        return b.call(
            "tract_core_gather", [flat, constant(picks)], {"axis": 0}, dtype=x.dtype, shape=tuple(picks.shape)
        )
    full = broadcast_to(b, cast(b, mask, torch.bool), shape, torch.bool)
    return b.call(
        "tract_core_gather", [flat, mask_positions(b, full)], {"axis": 0}, dtype=x.dtype, shape=(1,)
    )


@rule(
    "aten::_unique2",
    "aten::unique_dim",
    "aten::unique_consecutive",
    "aten::_unique",
    "aten::unique_dim_consecutive",
)
def unique(b: Builder, x: Value, *args: object) -> Value:
    """_unique2(Tensor self, bool sorted=True, bool return_inverse=False, bool return_counts=False) -> (Tensor, Tensor, Tensor)"""  # noqa: E501
    raise LoweringError(
        "unique: tract 0.23.9 has no unique op (its NNEF registries have none), so a result whose "
        "size is the number of distinct values cannot be exported; compute it outside the model or "
        "use a fixed-size form (torch.bincount with minlength, a one-hot sum, or a sort)"
    )

"""NumPy-style stacking: vstack / hstack / dstack / column_stack (and row_stack).

Each promotes its operands to a minimum rank the way ``torch.atleast_{1,2,3}d`` does, then
concatenates along one axis with ``cat`` (which also promotes mixed dtypes like torch).
"""

from __future__ import annotations

from collections.abc import Sequence

from torchlower.core.values import Dim, Value
from torchlower.rules import rule
from torchlower.rules.common import Builder, reshape
from torchlower.rules.layout import dims_of
from torchlower.rules.shape import cat


def _at_least(b: Builder, x: Value, rank: int) -> Value:
    """``torch.atleast_{rank}d``: 0-d → (1,…), 1-D (n) → (1, n) / (1, n, 1), 2-D → (m, n, 1)."""
    if x.rank >= rank:
        return x
    dims: list[Dim] = list(dims_of(x))
    if rank == 1 or x.rank == 0:
        shape = [1] * rank
    elif rank == 2:
        shape = [1, *dims]
    else:
        shape = [1, *dims, 1] if x.rank == 1 else [*dims, 1]
    return reshape(b, x, shape)


@rule("aten::vstack", "aten::row_stack")
def vstack(b: Builder, tensors: Sequence[Value]) -> Value:
    """vstack(Tensor[] tensors) -> Tensor"""
    return cat(b, [_at_least(b, t, 2) for t in tensors], 0)


@rule("aten::hstack")
def hstack(b: Builder, tensors: Sequence[Value]) -> Value:
    """hstack(Tensor[] tensors) -> Tensor: along dim 0 when every operand is 1-D, else dim 1."""
    parts = [_at_least(b, t, 1) for t in tensors]
    return cat(b, parts, 0 if all(p.rank == 1 for p in parts) else 1)


@rule("aten::dstack")
def dstack(b: Builder, tensors: Sequence[Value]) -> Value:
    """dstack(Tensor[] tensors) -> Tensor"""
    return cat(b, [_at_least(b, t, 3) for t in tensors], 2)


@rule("aten::column_stack")
def column_stack(b: Builder, tensors: Sequence[Value]) -> Value:
    """column_stack(Tensor[] tensors) -> Tensor: 0-d and 1-D operands become columns (n, 1)."""
    parts = [reshape(b, t, [*dims_of(t), 1] if t.rank == 1 else [1, 1]) if t.rank < 2 else t for t in tensors]
    return cat(b, parts, 1)

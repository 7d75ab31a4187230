"""Shared pieces of the fuzz catalogue: input specs, drawn arguments, ops, scalar and shape draws."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from hypothesis import strategies as st

Draw = Callable[[st.SearchStrategy[Any]], Any]
KINDS = {torch.float32: "f", torch.int64: "i", torch.bool: "b"}
MAX_NUMEL = 2048


@dataclass(frozen=True)
class Spec:
    """What a drawer sees of a value: shape, dtype and whether it is bit-exact."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    exact: bool = True
    nan: bool = False

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def kind(self) -> str:
        return KINDS[self.dtype]


@dataclass(frozen=True)
class Args:
    """Drawn arguments: keyword params, extra operands (shape, dtype) and constant weights."""

    params: dict[str, Any] = field(default_factory=dict)
    others: tuple[tuple[tuple[int, ...], torch.dtype], ...] = ()
    weights: tuple[torch.Tensor, ...] = ()


@dataclass(frozen=True)
class Op:
    """``fn(x, *others, *weights, **params)``; ``args(draw, x)`` gives ``Args`` or None (not here)."""

    name: str
    fn: Callable[..., torch.Tensor]
    args: Callable[[Draw, Spec], Args | None] = lambda d, x: Args()
    kinds: str = "f"
    exact: bool = False
    discontinuous: bool = False
    min_rank: int = 0


# ---- argument strategies ---------------------------------------------------------------------
SCALARS = st.one_of(
    st.sampled_from([0, 1, -1, 2, -3, 0.0, 0.5, -0.5, 1.5, -2.25, 3.0, 0.1]),
    st.floats(-4, 4, allow_nan=False).map(lambda v: round(v, 3)),
)


def dim(d: Draw, x: Spec) -> int:
    return d(st.integers(-x.rank, x.rank - 1))


def dims(d: Draw, x: Spec, min_size: int = 1) -> list[int]:
    picked = d(st.lists(st.integers(0, x.rank - 1), min_size=min_size, max_size=x.rank, unique=True))
    return [p - x.rank if d(st.booleans()) else p for p in picked]


def broadcast_shape(d: Draw, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with ``shape``: some dims set to 1, some leading dims dropped."""
    out = tuple(1 if d(st.integers(0, 3)) == 0 else n for n in shape)
    return out[d(st.integers(0, len(out))) :] if d(st.booleans()) else out


def weight(d: Draw, *shape: int, scale: float = 1.0, positive: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(d(st.integers(0, 2**20)))
    w = torch.randn(*shape, generator=g) * scale
    return w.abs() + 0.5 if positive else w


def int_weight(d: Draw, shape: tuple[int, ...], high: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(d(st.integers(0, 2**20)))
    return torch.randint(-high, high, shape, generator=g)

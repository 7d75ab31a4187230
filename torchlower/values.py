"""Symbolic values: what flows from a front end through the rules into a builder.

A value is a graph identifier plus what rules need to know about it: dtype and shape
(dims are ints, or symbol names such as ``"B"`` for dynamic axes) and, for constants,
the concrete tensor so rules and front ends can fold instead of emitting ops.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Union

if TYPE_CHECKING:
    import torch

Dim = Union[int, str]
Shape = tuple[Dim, ...]


@dataclass(frozen=True, eq=False)
class Value:
    """A tensor in the graph being built (identity matters, so ``eq`` is by object)."""

    name: str
    dtype: torch.dtype | None = None
    shape: Shape | None = None
    const: torch.Tensor | None = field(default=None, repr=False)
    label: str | None = None  # weight path for constants that came from the model

    @property
    def rank(self) -> int:
        if self.shape is None:
            raise ValueError(f"value {self.name} has no known shape")
        return len(self.shape)

    @property
    def is_const(self) -> bool:
        return self.const is not None

    def static_shape(self) -> tuple[int, ...]:
        """The shape as ints; raises when a dim is symbolic (callers that need sizes baked)."""
        if self.shape is None or any(not isinstance(d, int) for d in self.shape):
            raise ValueError(f"value {self.name} has a non-static shape {self.shape}")
        return tuple(int(d) for d in self.shape)  # type: ignore[arg-type]

    def with_meta(self, dtype: torch.dtype | None, shape: Shape | None) -> Value:
        """Same value, with dtype/shape known from the front end (trace or export meta)."""
        return replace(
            self,
            dtype=dtype if dtype is not None else self.dtype,
            shape=shape if shape is not None else self.shape,
        )


def constant(tensor: torch.Tensor, label: str | None = None, name: str = "") -> Value:
    """A value known at export time."""
    return Value(
        name=name or (label or "const"),
        dtype=tensor.dtype,
        shape=tuple(tensor.shape),
        const=tensor,
        label=label,
    )


def normalize_dim(dim: int, rank: int) -> int:
    """Map a possibly negative ``dim`` into ``[0, rank)``."""
    if not -rank <= dim < max(rank, 1):
        raise IndexError(f"dim {dim} out of range for rank {rank}")
    return dim % rank if rank else 0

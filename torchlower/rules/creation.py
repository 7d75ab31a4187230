"""Creation: ``*_like`` / ``new_*`` of graph tensors, triu/tril.

Creation ops with static arguments (arange, zeros, ones, full, eye, linspace) never reach
these rules: the session folds them to constants. What remains are tensors shaped like a
graph value; they are written as a broadcast scalar, never as a full-size weight.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torchlower.rules import rule
from torchlower.rules.common import Builder
from torchlower.rules.layout import broadcast_to, dims_of, scalar_of
from torchlower.values import Value


def filled(b: Builder, value: float | int | bool, shape: Sequence[int], dtype: torch.dtype) -> Value:
    return broadcast_to(b, scalar_of(value, dtype, len(shape)), list(shape), dtype)


@rule("aten::zeros_like", "aten::empty_like")
def zeros_like(
    b: Builder, x: Value, dtype: torch.dtype | None, layout: object, device: object, pin_memory: bool | None,
    memory_format: object,
) -> Value:  # fmt: skip
    """zeros_like(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor"""  # noqa: E501
    return filled(b, 0, dims_of(x), dtype or x.dtype)


@rule("aten::ones_like")
def ones_like(
    b: Builder, x: Value, dtype: torch.dtype | None, layout: object, device: object, pin_memory: bool | None,
    memory_format: object,
) -> Value:  # fmt: skip
    """ones_like(Tensor self, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor"""  # noqa: E501
    return filled(b, 1, dims_of(x), dtype or x.dtype)


@rule("aten::full_like")
def full_like(
    b: Builder, x: Value, fill_value: float | int | bool, dtype: torch.dtype | None, layout: object,
    device: object, pin_memory: bool | None, memory_format: object,
) -> Value:  # fmt: skip
    """full_like(Tensor self, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor"""  # noqa: E501
    return filled(b, fill_value, dims_of(x), dtype or x.dtype)


@rule("aten::new_zeros", "aten::new_empty")
def new_zeros(
    b: Builder, x: Value, size: Sequence[int], dtype: torch.dtype | None, layout: object, device: object,
    pin_memory: bool | None,
) -> Value:  # fmt: skip
    """new_zeros(Tensor self, SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor"""  # noqa: E501
    return filled(b, 0, [int(s) for s in size], dtype or x.dtype)


@rule("aten::new_ones")
def new_ones(
    b: Builder, x: Value, size: Sequence[int], dtype: torch.dtype | None, layout: object, device: object,
    pin_memory: bool | None,
) -> Value:  # fmt: skip
    """new_ones(Tensor self, SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor"""  # noqa: E501
    return filled(b, 1, [int(s) for s in size], dtype or x.dtype)


@rule("aten::new_full")
def new_full(
    b: Builder, x: Value, size: Sequence[int], fill_value: float | int | bool, dtype: torch.dtype | None,
    layout: object, device: object, pin_memory: bool | None,
) -> Value:  # fmt: skip
    """new_full(Tensor self, SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor"""  # noqa: E501
    return filled(b, fill_value, [int(s) for s in size], dtype or x.dtype)


def _trilu(b: Builder, x: Value, diagonal: int, upper: bool) -> Value:
    return b.call("tract_core_trilu", [x, int(diagonal)], {"upper": upper}, dtype=x.dtype, shape=x.shape)


@rule("aten::triu")
def triu(b: Builder, x: Value, diagonal: int) -> Value:
    """triu(Tensor self, int diagonal=0) -> Tensor"""
    return _trilu(b, x, diagonal, True)


@rule("aten::tril")
def tril(b: Builder, x: Value, diagonal: int) -> Value:
    """tril(Tensor self, int diagonal=0) -> Tensor"""
    return _trilu(b, x, diagonal, False)

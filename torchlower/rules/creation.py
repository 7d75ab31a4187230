"""Creation: ``*_like`` / ``new_*`` of graph tensors, triu/tril.

Creation ops with static arguments (arange, zeros, ones, full, eye, linspace) never reach
these rules: the session folds them to constants (with a symbolic size they do reach them).
What remains are tensors shaped like a graph value; they are written as a broadcast scalar,
never as a full-size weight.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from torchlower.core.values import Dim, SymDim, Value, constant
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder, cast, size_tensor
from torchlower.rules.layout import broadcast_to, dims_of, scalar_of


def filled(b: Builder, value: float | int | bool, shape: Sequence[Dim], dtype: torch.dtype) -> Value:
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
    return filled(b, 0, list(size), dtype or x.dtype)


@rule("aten::new_ones")
def new_ones(
    b: Builder, x: Value, size: Sequence[int], dtype: torch.dtype | None, layout: object, device: object,
    pin_memory: bool | None,
) -> Value:  # fmt: skip
    """new_ones(Tensor self, SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor"""  # noqa: E501
    return filled(b, 1, list(size), dtype or x.dtype)


@rule("aten::new_full")
def new_full(
    b: Builder, x: Value, size: Sequence[int], fill_value: float | int | bool, dtype: torch.dtype | None,
    layout: object, device: object, pin_memory: bool | None,
) -> Value:  # fmt: skip
    """new_full(Tensor self, SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor"""  # noqa: E501
    return filled(b, fill_value, list(size), dtype or x.dtype)


@rule("aten::zeros")
def zeros(
    b: Builder, size: Sequence[Dim], dtype: torch.dtype | None, layout: object, device: object,
    pin_memory: bool | None,
) -> Value:  # fmt: skip
    """zeros(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor

    Reached only with a symbolic size (e.g. the zero state nn.LSTM makes for a dynamic batch).
    """  # noqa: E501
    return filled(b, 0, list(size), dtype or torch.float32)


@rule("aten::empty")
def empty(
    b: Builder, size: Sequence[Dim], dtype: torch.dtype | None, layout: object, device: object,
    pin_memory: bool | None, memory_format: object,
) -> Value:  # fmt: skip
    """empty.memory_format(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None, MemoryFormat? memory_format=None) -> Tensor

    Reached only with a symbolic size (a buffer the model then fills): zeros, so the archive
    holds no uninitialized memory and the same model always gives the same bytes.
    """  # noqa: E501
    return filled(b, 0, list(size), dtype or torch.get_default_dtype())


@rule("aten::ones")
def ones(
    b: Builder, size: Sequence[Dim], dtype: torch.dtype | None, layout: object, device: object,
    pin_memory: bool | None,
) -> Value:  # fmt: skip
    """ones(SymInt[] size, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor

    Reached only with a symbolic size (e.g. a causal mask ``ones(S, S).triu(1)``).
    """  # noqa: E501
    return filled(b, 1, list(size), dtype or torch.get_default_dtype())


@rule("aten::full")
def full(
    b: Builder, size: Sequence[Dim], fill_value: float | int | bool, dtype: torch.dtype | None,
    layout: object,
    device: object, pin_memory: bool | None,
) -> Value:  # fmt: skip
    """full(SymInt[] size, Scalar fill_value, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor

    Reached only with a symbolic size; the dtype follows the fill value, as in torch.
    """  # noqa: E501
    return filled(b, fill_value, list(size), dtype or torch.tensor(fill_value).dtype)


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


def _arange(
    b: Builder, start: Dim | Value, end: Dim | Value, step: Dim | Value, dtype: torch.dtype | None
) -> Value:
    """``tract_core_range`` over sizes: static aranges were folded, so a bound is symbolic here."""
    if any(isinstance(v, Value) for v in (start, end, step)):
        return _tensor_arange(b, [start, end, step], dtype)
    for name, v in (("start", start), ("end", end), ("step", step)):
        if not isinstance(v, (int, SymDim)):
            raise LoweringError(f"arange: {name} must be an integer or a size, got {v!r}")
    if step == 1 or not isinstance(start, int) or not isinstance(step, int):
        size = (end - start) // step
        out = b.call("tract_core_range", [start, end, step], dtype=torch.int64, shape=(size,))
        out = b.call("tract_core_cast", [out], {"to": "i64"}, dtype=torch.int64, shape=out.shape)
        return _series(cast(b, out, dtype or torch.int64), start, step)
    # tract sizes range(a, b, s) as (b - a + s - 1) / s, which it cannot simplify ((2S + 1) / 2 is
    # not S): a range of the simplified length, scaled and shifted, has the size torch gives
    length = (end - start + step - 1) // step
    out = b.call("tract_core_range", [0, length, 1], dtype=torch.int64, shape=(length,))
    out = b.call("tract_core_cast", [out], {"to": "i64"}, dtype=torch.int64, shape=out.shape)
    out = b.call("add", [b.call("mul", [out, constant(torch.tensor([int(step)]))], dtype=torch.int64,
                                shape=out.shape), constant(torch.tensor([int(start)]))],
                 dtype=torch.int64, shape=out.shape)  # fmt: skip
    return _series(cast(b, out, dtype or torch.int64), start, step)


def _tensor_arange(b: Builder, bounds: list[Dim | Value], dtype: torch.dtype | None) -> Value:
    """``arange`` over 0-d integer tensors computed in the graph (``torch.arange(s, e, st)`` on
    inputs): tract's range then sizes its output with a fresh symbol, read at run time."""
    operands = []
    for name, v in zip(("start", "end", "step"), bounds, strict=True):
        if isinstance(v, Value) and (v.rank != 0 or v.dtype is None or v.dtype.is_floating_point):
            raise LoweringError(
                f"arange: {name} must be a 0-d integer tensor, got {v.dtype} of shape {list(v.shape)}; "
                "floating-point bounds computed in the graph are not supported (cast them to int64)"
            )
        if isinstance(v, Value):
            operands.append(cast(b, v, torch.int64))
        else:  # an int literal would be a TDim in tract, which its range refuses beside an i64
            one = size_tensor(b, v) if isinstance(v, SymDim) else constant(torch.tensor([int(v)]))
            operands.append(
                one if one.rank == 0 else b.call("squeeze", [one], {"axes": [0]}, dtype=torch.int64, shape=())
            )
    out = b.call("tract_core_range", operands, dtype=torch.int64, shape=(None,))
    return cast(b, out, dtype or torch.int64)


def _series(out: Value, start: Dim, step: Dim) -> Value:
    """An integer range keeps its elements as sizes (``arange(P, P + S)[0]`` is ``P``)."""
    if out.dtype is None or out.dtype.is_floating_point or out.dtype == torch.bool:
        return out
    return replace(out, series=(start, step))


@rule("aten::arange")
def arange(
    b: Builder, end: Dim | Value, dtype: torch.dtype | None = None, layout: object = None,
    device: object = None, pin_memory: bool | None = None,
) -> Value:  # fmt: skip
    """arange(Scalar end, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor"""  # noqa: E501
    return _arange(b, 0, end, 1, dtype)


@rule("aten::arange.start")
def arange_start(
    b: Builder, start: Dim | Value, end: Dim | Value, dtype: torch.dtype | None = None, layout: object = None,
    device: object = None, pin_memory: bool | None = None,
) -> Value:  # fmt: skip
    """arange.start(Scalar start, Scalar end, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor"""  # noqa: E501
    return _arange(b, start, end, 1, dtype)


@rule("aten::arange.start_step")
def arange_start_step(
    b: Builder, start: Dim | Value, end: Dim | Value, step: Dim | Value, dtype: torch.dtype | None = None,
    layout: object = None, device: object = None, pin_memory: bool | None = None,
) -> Value:  # fmt: skip
    """arange.start_step(Scalar start, Scalar end, Scalar step=1, *, ScalarType? dtype=None, Layout? layout=None, Device? device=None, bool? pin_memory=None) -> Tensor"""  # noqa: E501
    return _arange(b, start, end, step, dtype)

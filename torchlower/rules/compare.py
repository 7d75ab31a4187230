"""Comparisons, boolean logic and predicates (isnan / isinf), any / all reductions.

Operands are promoted like torch before comparing (``int_tensor < 0.5`` compares as float);
tract's ``eq``/``ne`` reject booleans, so those go through ``tract_core_xor``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torchlower.core.values import Value, normalize_dim
from torchlower.rules import rule
from torchlower.rules.common import Builder, Operand
from torchlower.rules.math import binary


def _compare(op: str) -> object:
    def lower(b: Builder, x: Operand, y: Operand) -> Value:
        return binary(b, op, x, y)

    lower.__doc__ = f"{op}.Tensor(Tensor self, Tensor other) -> Tensor (also .Scalar)"
    lower.__name__ = lower.__qualname__ = op
    return lower


# no front end emits aten::__eq__ & co. for tensors (jit, fx and export all give aten::eq): not keys
for _op, _aliases in {
    "eq": ("eq", "eq_"),
    "ne": ("ne", "ne_", "not_equal"),
    "lt": ("lt", "lt_", "less"),
    "le": ("le", "le_", "less_equal"),
    "gt": ("gt", "gt_", "greater"),
    "ge": ("ge", "ge_", "greater_equal"),
}.items():
    rule(*(f"aten::{a}" for a in _aliases))(_compare(_op))


def truthy(b: Builder, x: Value) -> Value:
    """Non-zero as true: logical ops accept any dtype."""
    if x.dtype == torch.bool:
        return x
    return binary(b, "ne", x, 0)


def _logical(op: str) -> object:
    def lower(b: Builder, x: Value, y: Value) -> Value:
        return binary(b, op, truthy(b, x), truthy(b, y), dtype=torch.bool)

    lower.__doc__ = f"logical_{op}(Tensor self, Tensor other) -> Tensor"
    return lower


rule("aten::logical_and", "aten::logical_and_")(_logical("and"))
rule("aten::logical_or", "aten::logical_or_")(_logical("or"))
rule("aten::logical_xor", "aten::logical_xor_")(_logical("tract_core_xor"))


@rule("aten::logical_not", "aten::logical_not_")
def logical_not(b: Builder, x: Value) -> Value:
    """logical_not(Tensor self) -> Tensor"""
    return b.call("not", [truthy(b, x)], dtype=torch.bool, shape=x.shape)


_BITWISE = {"and": "tract_core_bitand", "or": "tract_core_bitor", "tract_core_xor": "tract_core_bitxor"}


def _bitwise(op: str) -> object:
    def lower(b: Builder, x: Operand, y: Operand) -> Value:
        both_bool = all(v.dtype == torch.bool for v in (x, y) if isinstance(v, Value))
        if both_bool and all(isinstance(v, (Value, bool)) for v in (x, y)):
            return binary(b, op, x, y, dtype=torch.bool)
        return binary(b, _BITWISE[op], x, y)

    lower.__doc__ = "bitwise_and.Tensor(Tensor self, Tensor other) -> Tensor (bool: logical)"
    return lower


rule("aten::bitwise_and", "aten::bitwise_and_", "aten::__and__", "aten::__iand__")(_bitwise("and"))
rule("aten::bitwise_or", "aten::bitwise_or_", "aten::__or__", "aten::__ior__")(_bitwise("or"))
rule("aten::bitwise_xor", "aten::bitwise_xor_", "aten::__xor__", "aten::__ixor__")(_bitwise("tract_core_xor"))


@rule("aten::bitwise_not", "aten::bitwise_not_")
def bitwise_not(b: Builder, x: Value) -> Value:
    """bitwise_not(Tensor self) -> Tensor"""
    op = "not" if x.dtype == torch.bool else "tract_core_bitnot"
    return b.call(op, [x], dtype=x.dtype, shape=x.shape)


# ---- predicates -----------------------------------------------------------------------------


def _is_float(x: Value) -> bool:
    return x.dtype is not None and x.dtype.is_floating_point


def _false_like(b: Builder, x: Value) -> Value:
    return binary(b, "ne", x, x)  # integers are never NaN or infinite


@rule("aten::isnan")
def isnan(b: Builder, x: Value) -> Value:
    """isnan(Tensor self) -> Tensor"""
    if not _is_float(x):
        return _false_like(b, x)
    return b.call("tract_core_is_nan", [x], dtype=torch.bool, shape=x.shape)


def _is_inf(b: Builder, x: Value, positive: bool, negative: bool) -> Value:
    if not _is_float(x):
        return _false_like(b, x)
    attrs = {"detect_positive": positive, "detect_negative": negative}
    return b.call("tract_core_is_inf", [x], attrs, dtype=torch.bool, shape=x.shape)


@rule("aten::isinf")
def isinf(b: Builder, x: Value) -> Value:
    """isinf(Tensor self) -> Tensor"""
    return _is_inf(b, x, True, True)


@rule("aten::isposinf")
def isposinf(b: Builder, x: Value) -> Value:
    """isposinf(Tensor self) -> Tensor"""
    return _is_inf(b, x, True, False)


@rule("aten::isneginf")
def isneginf(b: Builder, x: Value) -> Value:
    """isneginf(Tensor self) -> Tensor"""
    return _is_inf(b, x, False, True)


@rule("aten::isfinite")
def isfinite(b: Builder, x: Value) -> Value:
    """isfinite(Tensor self) -> Tensor"""
    if not _is_float(x):
        return binary(b, "eq", x, x)
    bad = binary(b, "or", isnan(b, x), isinf(b, x), dtype=torch.bool)
    return b.call("not", [bad], dtype=torch.bool, shape=x.shape)


# ---- any / all ------------------------------------------------------------------------------


def bool_reduce(b: Builder, op: str, x: Value, dims: Sequence[int] | None, keepdim: bool) -> Value:
    """``any_reduce``/``all_reduce`` over ``dims`` (all when None/empty), squeezed unless keepdim."""
    rank = x.rank
    axes = sorted({normalize_dim(d, rank) for d in dims}) if dims else list(range(rank))
    if rank == 0:
        return truthy(b, x)
    shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape or ()))
    y = b.call(op, [truthy(b, x)], {"axes": axes}, dtype=torch.bool, shape=shape)
    if keepdim:
        return y
    kept = tuple(d for i, d in enumerate(shape) if i not in axes)
    return b.call("squeeze", [y], {"axes": axes}, dtype=torch.bool, shape=kept)


def _dims(dim: int | Sequence[int] | None) -> list[int] | None:
    if dim is None:
        return None
    if isinstance(dim, int):
        return [dim]
    return list(dim)


@rule("aten::any")
def any_(b: Builder, x: Value, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Value:
    """any(Tensor self) -> Tensor / any.dim(Tensor self, int dim, bool keepdim=False) / any.dims"""
    if isinstance(dim, Sequence) and not dim:  # torch reduces nothing over an empty dim list
        return truthy(b, x)
    return bool_reduce(b, "any_reduce", x, _dims(dim), keepdim)


@rule("aten::all")
def all_(b: Builder, x: Value, dim: int | Sequence[int] | None = None, keepdim: bool = False) -> Value:
    """all(Tensor self) -> Tensor / all.dim(Tensor self, int dim, bool keepdim=False) / all.dims"""
    if isinstance(dim, Sequence) and not dim:  # torch reduces nothing over an empty dim list
        return truthy(b, x)
    return bool_reduce(b, "all_reduce", x, _dims(dim), keepdim)

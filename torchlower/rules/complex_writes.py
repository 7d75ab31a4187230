"""Writes into complex tensors: ``fill``, ``copy``, ``zero`` and the scatters the front ends write
views back with (``slice_scatter``, ``select_scatter``), so ``spec[:, 0] = 0`` (a zeroed DC bin),
``spec[:, 1:4] *= 2`` and ``spec[..., -1] = spec[..., 0]`` work on a complex spectrum.

Each is the real rule on the ``[re, im]`` tensors (``complex_parts.py``); a real source is
``x + 0i``, a scalar ``c`` fills the parts with ``c.real`` and ``c.imag``.
"""

from __future__ import annotations

import torch

from torchlower.core.values import Value, constant
from torchlower.errors import LoweringError
from torchlower.rules import scatter_extra
from torchlower.rules.common import Builder
from torchlower.rules.complex_parts import REAL_OF, complex_override, is_complex, physical, to_complex
from torchlower.rules.complex_views import back, logical_dim
from torchlower.rules.layout import broadcast_to, dims_of


def _source(b: Builder, src: Value | complex | float | int | bool, like: Value) -> Value:
    """``src`` as a physical ``[..., 2]`` tensor (broadcastable to ``like``'s physical shape)."""
    if isinstance(src, Value):
        if src.is_const and src.const.dim() == 0:
            src = complex(src.const.item())
        else:
            return physical(src) if is_complex(src) else to_complex(b, src)
    z = complex(src)
    dtype = REAL_OF.get(like.dtype, torch.float32)  # type: ignore[arg-type]
    return constant(torch.tensor([z.real, z.imag], dtype=dtype))


def _filled(b: Builder, z: Value, src: Value | complex | float | int | bool) -> Value:
    p = physical(z)
    return back(broadcast_to(b, _source(b, src, z), list(dims_of(p)), p.dtype))


@complex_override("fill", "fill_")
def fill(b: Builder, z: Value, value: Value | complex | float | int | bool) -> Value:
    """fill.Scalar(Tensor self, Scalar value) -> Tensor (also .Tensor, in place) of a complex tensor."""
    return _filled(b, z, value)


@complex_override("copy", "copy_")
def copy(b: Builder, z: Value, src: Value | complex | float, non_blocking: bool = False) -> Value:
    """copy(Tensor self, Tensor src, bool non_blocking=False) -> Tensor into a complex tensor; a
    complex ``src`` into a real tensor is refused (torch drops the imaginary part with a warning)."""
    if not is_complex(z):
        raise LoweringError("copy of a complex tensor into a real one (torch discards the imaginary part)")
    return _filled(b, z, src)


@complex_override("zero", "zero_")
def zero(b: Builder, z: Value) -> Value:
    """zero(Tensor self) -> Tensor of a complex tensor."""
    return _filled(b, z, 0.0)


def _pair(b: Builder, x: Value, src: Value) -> tuple[Value, Value]:
    """``x`` and ``src`` physical, the real one as ``v + 0i`` (either may be the complex one)."""
    like = x if is_complex(x) else src
    px = physical(x) if is_complex(x) else to_complex(b, x)
    ps = _source(b, src, like)
    return px, ps


@complex_override("slice_scatter")
def slice_scatter(
    b: Builder, x: Value, src: Value, dim: int = 0, start: int | None = None, end: int | None = None,
    step: int = 1,
) -> Value:  # fmt: skip
    """slice_scatter(Tensor self, Tensor src, int dim=0, SymInt? start=None, SymInt? end=None,
    SymInt step=1) -> Tensor with a complex side."""
    px, ps = _pair(b, x, src)
    d = logical_dim(x, dim)
    if ps.rank != px.rank:  # a scalar source: the slice's shape
        shape = list(dims_of(px))
        lo, hi, _ = slice(start, end, step).indices(int(shape[d]))
        shape[d] = len(range(lo, hi, step))
        ps = broadcast_to(b, ps, shape, px.dtype)
    return back(scatter_extra.slice_scatter(b, px, ps, d, start, end, step))


@complex_override("select_scatter")
def select_scatter(b: Builder, x: Value, src: Value, dim: int, index: int) -> Value:
    """select_scatter(Tensor self, Tensor src, int dim, SymInt index) -> Tensor with a complex side."""
    px, ps = _pair(b, x, src)
    d = logical_dim(x, dim)
    if ps.rank != px.rank - 1:
        shape = [s for i, s in enumerate(dims_of(px)) if i != d]
        ps = broadcast_to(b, ps, shape, px.dtype)
    return back(scatter_extra.select_scatter(b, px, ps, d, index))

"""Complex tensors through views and shapes (arithmetic beyond products: ``complex_math.py``).

A complex ``Value`` keeps torch's (logical) shape; its NNEF tensor has one more trailing axis
``[re, im]`` (``complex_parts.py``). A view of it is the same view of that tensor with the
trailing axis kept last: dims are normalized on the logical rank (so ``-1`` is the last logical
dim, never ``[re, im]``) and a target shape gets ``2`` appended. ``size`` / ``numel`` read the
logical shape. What torchaudio's ``Spectrogram`` (``reshape(-1, T)`` and back), openai-whisper's
``stft[..., :-1]`` and HDemucs (``F.pad`` of its spectrum) do.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from torchlower.core.values import Dim, Value, constant, normalize_dim
from torchlower.errors import LoweringError
from torchlower.rules import conv, layout, shape
from torchlower.rules.common import Builder
from torchlower.rules.complex_parts import (
    COMPLEX_OF,
    complex_override,
    is_complex,
    physical,
    to_complex,
)
from torchlower.rules.layout import dims_of

__all__ = ["back", "logical_dim"]


def back(p: Any) -> Any:
    """A physical ``[..., 2]`` result (or a list of them) seen as complex again."""
    if isinstance(p, (list, tuple)):
        return type(p)(back(v) for v in p)
    if not isinstance(p, Value):
        return p
    if p.dtype not in COMPLEX_OF:
        raise LoweringError(f"a complex value needs float parts, got {p.dtype}")
    if p.is_const:
        return constant(torch.view_as_complex(p.const.contiguous()))
    logical_shape = tuple(dims_of(p)[:-1]) if p.shape is not None else None
    return Value(p.name, COMPLEX_OF[p.dtype], logical_shape, None, p.label)


def logical_dim(z: Value, dim: int, extra: int = 0) -> int:
    """A dim of the logical tensor (``extra`` = 1 for a new axis), valid on the physical one."""
    return normalize_dim(dim, z.rank + extra)


# ---- sizes: the logical shape ------------------------------------------------------------------
@complex_override("size")
def size(b: Builder, z: Value, dim: int | None = None) -> Any:
    """size.int(Tensor self, int dim) -> int / size(Tensor self) -> int[] of a complex tensor."""
    return shape.size(b, z, dim)


@complex_override("numel")
def numel(b: Builder, z: Value) -> Dim:
    """numel(Tensor self) -> int of a complex tensor (its complex elements)."""
    return shape.numel(b, z)


@complex_override("sym_size", "sym_numel")
def sym_size(b: Builder, z: Value, dim: int | None = None) -> Any:
    """sym_size.int(Tensor self, int dim) -> SymInt of a complex tensor."""
    return shape.numel(b, z) if dim is None else shape.size(b, z, dim)


# ---- views ---------------------------------------------------------------------------------------
@complex_override("reshape", "view", "_unsafe_view")
def reshape(b: Builder, z: Value, target: Sequence[Any]) -> Value:
    """reshape(Tensor(a) self, SymInt[] shape) -> Tensor(a) of a complex tensor: ``[*shape, 2]``."""
    if isinstance(target, torch.dtype):
        raise LoweringError("view(dtype) of a complex tensor is not supported; use view_as_real")
    return back(shape.reshape(b, physical(z), [*target, 2]))


@complex_override("reshape_as", "view_as")
def reshape_as(b: Builder, z: Value, other: Value) -> Value:
    """reshape_as(Tensor(a) self, Tensor other) -> Tensor(a) of a complex tensor."""
    return reshape(b, z, list(dims_of(other)))


@complex_override("flatten")
def flatten(b: Builder, z: Value, start_dim: int = 0, end_dim: int = -1) -> Value:
    """flatten.using_ints(Tensor(a) self, int start_dim=0, int end_dim=-1) -> Tensor(a)"""
    if z.rank == 0:
        return reshape(b, z, [1])
    return back(shape.flatten(b, physical(z), logical_dim(z, start_dim), logical_dim(z, end_dim)))


@complex_override("unflatten")
def unflatten(b: Builder, z: Value, dim: int, sizes: Sequence[int]) -> Value:
    """unflatten.int(Tensor(a) self, int dim, SymInt[] sizes) -> Tensor(a)"""
    return back(layout.unflatten(b, physical(z), logical_dim(z, dim), sizes))


@complex_override("permute")
def permute(b: Builder, z: Value, dims: Sequence[int]) -> Value:
    """permute(Tensor(a) self, int[] dims) -> Tensor(a): ``[re, im]`` stays last."""
    return back(shape.permute(b, physical(z), [*(logical_dim(z, d) for d in dims), z.rank]))


@complex_override("transpose", "swapaxes", "swapdims")
def transpose(b: Builder, z: Value, dim0: int, dim1: int) -> Value:
    """transpose.int(Tensor(a) self, int dim0, int dim1) -> Tensor(a)"""
    if z.rank < 2:
        return z
    return back(shape.transpose(b, physical(z), logical_dim(z, dim0), logical_dim(z, dim1)))


@complex_override("t", "numpy_T")
def t(b: Builder, z: Value) -> Value:
    """t(Tensor(a) self) -> Tensor(a)"""
    return permute(b, z, list(reversed(range(z.rank))))


@complex_override("movedim", "moveaxis")
def movedim(b: Builder, z: Value, source: int | Sequence[int], destination: int | Sequence[int]) -> Value:
    """movedim.intlist(Tensor(a) self, int[] source, int[] destination) -> Tensor(a)"""
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    p = physical(z)
    return back(layout.movedim_list(b, p, [logical_dim(z, s) for s in src], [logical_dim(z, d) for d in dst]))


@complex_override("squeeze")
def squeeze(b: Builder, z: Value, dim: int | Sequence[int] | None = None) -> Value:
    """squeeze.dims(Tensor(a) self, int[] dim) -> Tensor(a) (also squeeze, squeeze.dim)"""
    dims = range(z.rank) if dim is None else [dim] if isinstance(dim, int) else dim
    return back(shape.squeeze(b, physical(z), [logical_dim(z, d) for d in dims] if z.rank else []))


@complex_override("unsqueeze")
def unsqueeze(b: Builder, z: Value, dim: int) -> Value:
    """unsqueeze(Tensor(a) self, int dim) -> Tensor(a)"""
    return back(shape.unsqueeze(b, physical(z), logical_dim(z, dim, 1)))


@complex_override("slice")
def slice_(b: Builder, z: Value, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Value:
    """slice.Tensor(Tensor(a) self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1)"""
    return back(layout.slice_(b, physical(z), logical_dim(z, dim), start, end, step))


@complex_override("select")
def select(b: Builder, z: Value, dim: int, index: int) -> Value:
    """select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)"""
    return back(layout.select(b, physical(z), logical_dim(z, dim), index))


@complex_override("narrow")
def narrow(b: Builder, z: Value, dim: int, start: int | Value, length: int) -> Value:
    """narrow(Tensor(a) self, int dim, SymInt start, SymInt length) -> Tensor(a)"""
    return back(layout.narrow(b, physical(z), logical_dim(z, dim), start, length))


@complex_override("expand")
def expand(b: Builder, z: Value, size: Sequence[Any], implicit: bool = False) -> Value:
    """expand(Tensor(a) self, SymInt[] size, *, bool implicit=False) -> Tensor(a)"""
    return back(layout.expand(b, physical(z), [*size, 2], implicit))


@complex_override("expand_as")
def expand_as(b: Builder, z: Value, other: Value) -> Value:
    """expand_as(Tensor(a) self, Tensor other) -> Tensor(a)"""
    return expand(b, z, list(dims_of(other)))


@complex_override("flip")
def flip(b: Builder, z: Value, dims: Sequence[int]) -> Value:
    """flip(Tensor self, int[] dims) -> Tensor"""
    return back(layout.flip(b, physical(z), [logical_dim(z, d) for d in dims]))


@complex_override("roll")
def roll(b: Builder, z: Value, shifts: Sequence[int], dims: Sequence[int]) -> Value:
    """roll(Tensor self, SymInt[1] shifts, int[1] dims=[]) -> Tensor"""
    if not dims:
        raise LoweringError("roll of a complex tensor without dims (a flat roll) is not supported")
    return back(layout.roll(b, physical(z), shifts, [logical_dim(z, d) for d in dims]))


@complex_override("split", "unsafe_split")
def split(b: Builder, z: Value, split_size: int | Sequence[int], dim: int = 0) -> list[Value]:
    """split.Tensor(Tensor(a -> *) self, SymInt split_size, int dim=0) -> Tensor(a)[] (also .sizes)"""
    if isinstance(split_size, int):
        return back(layout.split(b, physical(z), split_size, logical_dim(z, dim)))
    return back(layout.split_with_sizes(b, physical(z), split_size, logical_dim(z, dim)))


@complex_override("split_with_sizes", "unsafe_split_with_sizes")
def split_with_sizes(b: Builder, z: Value, split_sizes: Sequence[int], dim: int = 0) -> list[Value]:
    """split_with_sizes(Tensor(a -> *) self, SymInt[] split_sizes, int dim=0) -> Tensor(a)[]"""
    return back(layout.split_with_sizes(b, physical(z), split_sizes, logical_dim(z, dim)))


@complex_override("chunk", "unsafe_chunk")
def chunk(b: Builder, z: Value, chunks: int, dim: int = 0) -> list[Value]:
    """chunk(Tensor(a -> *) self, int chunks, int dim=0) -> Tensor(a)[]"""
    return back(layout.chunk(b, physical(z), chunks, logical_dim(z, dim)))


@complex_override("unbind")
def unbind(b: Builder, z: Value, dim: int = 0) -> list[Value]:
    """unbind.int(Tensor(a -> *) self, int dim=0) -> Tensor(a)[]"""
    return back(layout.unbind(b, physical(z), logical_dim(z, dim)))


def _parts(tensors: Sequence[Value], b: Builder) -> tuple[Value, list[Value]]:
    like = next(v for v in tensors if is_complex(v))
    return like, [physical(v) if is_complex(v) else to_complex(b, v) for v in tensors]


@complex_override("cat", "concat", "concatenate")
def cat(b: Builder, tensors: Sequence[Value], dim: int = 0) -> Value:
    """cat(Tensor[] tensors, int dim=0) -> Tensor of complex (and real, as ``x + 0i``) tensors."""
    like, parts = _parts(tensors, b)
    return back(shape.cat(b, parts, logical_dim(like, dim)))


@complex_override("stack")
def stack(b: Builder, tensors: Sequence[Value], dim: int = 0) -> Value:
    """stack(Tensor[] tensors, int dim=0) -> Tensor"""
    like, parts = _parts(tensors, b)
    return back(layout.stack(b, parts, logical_dim(like, dim, 1)))


@complex_override("contiguous", "clone", "detach", "detach_", "lift_fresh", "lift_fresh_copy", "alias")
def identity(b: Builder, z: Value, memory_format: object = None) -> Value:
    """contiguous(Tensor(a) self, *, MemoryFormat memory_format=contiguous_format) -> Tensor(a)"""
    return z


@complex_override("_to_copy", "to")
def to(b: Builder, z: Value, *args: Any) -> Value:
    """_to_copy(Tensor self, *, ScalarType? dtype=None, ...) -> Tensor: only to the same dtype."""
    dtypes = [a for a in args if isinstance(a, torch.dtype)]
    dtypes += [a.dtype for a in args if isinstance(a, Value) and a.dtype is not None]  # to(other)
    if any(d != z.dtype for d in dtypes):
        raise LoweringError(f"a cast of a {z.dtype} tensor to {dtypes[0]} is not supported")
    return z


@complex_override("pad")
def pad(
    b: Builder, z: Value, padding: Sequence[int], mode: str = "constant", value: float | None = None
) -> Value:
    """pad(Tensor self, SymInt[] pad, str mode="constant", float? value=None) -> Tensor of a complex
    tensor (HDemucs pads its spectrum): the logical dims padded, ``[re, im]`` not."""
    if mode == "constant" and value:
        raise LoweringError(f"pad of a complex tensor with value {value}: only zeros are supported")
    return back(conv.pad(b, physical(z), [0, 0, *padding], mode, None))  # torch's order: last dim first


@complex_override("constant_pad_nd")
def constant_pad_nd(b: Builder, z: Value, padding: Sequence[int], value: float = 0.0) -> Value:
    """constant_pad_nd(Tensor self, SymInt[] pad, Scalar value=0) -> Tensor of a complex tensor."""
    return pad(b, z, padding, "constant", value)

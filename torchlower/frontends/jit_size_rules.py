"""Size rules of the ops whose output length jit fitting cannot guess from a few captures.

A convolution or pooling with stride 160 maps input length u to ``floor((u + r) / 160) + d``;
from a handful of sampled lengths hundreds of (divisor, offset) pairs fit, and telling them
apart takes a capture per bit. The op's own arguments (kernel, stride, padding, dilation) give
the one form directly; the fitter still checks it against every capture before using it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from torchlower.core.size_forms import Form, window_form

_CONV = ("aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d")
_MAX_POOL = ("aten::max_pool1d", "aten::max_pool2d", "aten::max_pool3d", "aten::max_pool1d_with_indices",
             "aten::max_pool2d_with_indices", "aten::max_pool3d_with_indices")  # fmt: skip
_AVG_POOL = ("aten::avg_pool1d", "aten::avg_pool2d", "aten::avg_pool3d")


def window_hints(copies: Sequence[Any], module: nn.Module | None) -> dict[int, tuple[int, Form]]:
    """``{output dim: (input dim, form)}`` for one node (its copy in every traced graph) of the
    first input to the first output; empty when the op has no such rule or an argument moves
    with the size."""
    node = copies[0]
    kind = node.kind()
    args = list(node.inputs())
    if kind in _CONV:
        if kind == "aten::_convolution" and _const(copies, 6) is not False:
            return {}  # transposed: affine in u, which fitting finds exactly
        weight = _weight_shape(args[1], module)
        stride, padding, dilation = (_const(copies, k) for k in (3, 4, 5))
        if weight is None or not all(isinstance(v, list) for v in (stride, padding, dilation)):
            return {}
        kernels = list(weight[2:])
    elif kind in _MAX_POOL + _AVG_POOL:
        kernels, stride, padding = (_const(copies, k) for k in (1, 2, 3))
        dilation = _const(copies, 4) if kind in _MAX_POOL else [1] * len(kernels or [])
        ceil = _const(copies, 5 if kind in _MAX_POOL else 4)
        if ceil is not False or not all(isinstance(v, list) for v in (kernels, stride, padding, dilation)):
            return {}
        stride = stride or kernels
    elif kind == "aten::stft":  # (…, L) → (…, freq, frames): frames of n_fft every hop_length
        n_fft, hop = _const(copies, 1), _const(copies, 2)
        rank = _rank(args[0])
        if not isinstance(n_fft, int) or rank is None or not isinstance(hop, (int, type(None))):
            return {}
        return {rank: (rank - 1, window_form(n_fft, hop if hop is not None else n_fft // 4, 0))}
    elif kind == "aten::unfold":
        dim, size, step = (_const(copies, k) for k in (1, 2, 3))
        rank = _rank(args[0])
        if not all(isinstance(v, int) for v in (dim, size, step)) or rank is None:
            return {}
        dim %= rank
        return {dim: (dim, window_form(size, step, 0))}
    else:
        return {}
    n = len(kernels)
    rank_in, rank_out = _rank(args[0]), _rank(node.output() if node.outputsSize() == 1 else node.outputsAt(0))
    if rank_in is None or rank_out is None or n == 0:
        return {}
    stride, padding, dilation = (v * n if len(v) == 1 else v for v in (stride, padding, dilation))
    return {
        rank_out - n + i: (rank_in - n + i, window_form(kernels[i], stride[i], padding[i], dilation[i]))
        for i in range(n)
    }


def _const(copies: Sequence[Any], k: int) -> Any:
    """Input ``k`` of the node as a constant (int, bool, int list), the same in every graph."""
    values = [_value(list(c.inputs())[k]) for c in copies]
    return values[0] if all(v == values[0] for v in values) else None


def _value(v: Any) -> Any:
    node = v.node()
    if node.kind() == "prim::Constant":
        return v.toIValue()
    if node.kind() == "prim::ListConstruct":
        items = [_value(x) for x in node.inputs()]
        return items if all(isinstance(i, int) for i in items) else None
    return None


def _weight_shape(v: Any, module: nn.Module | None) -> list[int] | None:
    sizes = v.type().sizes() if isinstance(v.type(), torch._C.TensorType) else None
    if sizes is not None:
        return list(sizes)
    found = v.toIValue() if v.node().kind() == "prim::Constant" else _attr(v, module)
    return list(found.shape) if isinstance(found, torch.Tensor) else None


def _attr(v: Any, module: nn.Module | None) -> Any:
    """The module attribute a ``prim::GetAttr`` chain from ``self`` reads (a conv's weight)."""
    node = v.node()
    if node.kind() == "prim::GetAttr":
        owner = _attr(node.input(), module)
        return getattr(owner, node.s("name"), None) if owner is not None else None
    if node.kind() == "prim::Param" and v.offset() == 0:
        return module
    return None


def _rank(v: Any) -> int | None:
    ty = v.type()
    dim = ty.dim() if hasattr(ty, "dim") else None
    return int(dim) if dim is not None else None

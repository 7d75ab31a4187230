"""Sampling at computed positions and sliding blocks: grid_sample, F.unfold (im2col), F.fold (col2im).

``grid_sample`` maps onto ``tract_core_grid_sample``, which follows the PyTorch/ONNX contract
(modes bilinear / nearest / bicubic, padding zeros / border / reflection, both align_corners).
``unfold`` is one gather of constant flat positions from the zero-padded input; ``fold`` is the
scatter-add of the same positions, so overlapping blocks sum like torch's col2im.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torchlower.core.values import Dim, Value, constant
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder, cast, reshape, size_tensor
from torchlower.rules.creation import filled
from torchlower.rules.indexing import scatter_elements
from torchlower.rules.layout import dims_of, gather_axis, slice_dim
from torchlower.rules.math import binary

_MODES = {0: "bilinear", 1: "nearest", 2: "bicubic"}
_PADDINGS = {0: "zeros", 1: "border", 2: "reflection"}


@rule("aten::grid_sampler", "aten::grid_sampler_2d", "aten::grid_sampler_3d")
def grid_sampler(
    b: Builder, x: Value, grid: Value, interpolation_mode: int, padding_mode: int, align_corners: bool
) -> Value:
    """grid_sampler(Tensor input, Tensor grid, int interpolation_mode, int padding_mode, bool align_corners) -> Tensor"""  # noqa: E501
    if interpolation_mode not in _MODES or padding_mode not in _PADDINGS:
        raise LoweringError(
            f"grid_sample: mode {interpolation_mode} / padding_mode {padding_mode} unknown "
            f"(expected modes {_MODES}, paddings {_PADDINGS})"
        )
    if interpolation_mode == 2 and x.rank != 4:
        raise LoweringError("grid_sample: bicubic is defined for 4-D inputs only (as in torch)")
    if interpolation_mode == 2 and padding_mode == 1:
        # torch clamps each of the 16 bicubic taps to the border; tract 0.23.9 computes another
        # value there (max |torch - tract| ~0.45 on unit inputs): refuse rather than be wrong
        raise LoweringError(
            "grid_sample: mode='bicubic' with padding_mode='border' differs in tract 0.23; use "
            "padding_mode='zeros' or 'reflection', or mode='bilinear'"
        )
    attrs = {
        "mode": _MODES[interpolation_mode],
        "padding_mode": _PADDINGS[padding_mode],
        "align_corners": bool(align_corners),
    }
    shape = (*dims_of(x)[:2], *dims_of(grid)[1:-1])
    return b.call("tract_core_grid_sample", [x, grid], attrs, dtype=x.dtype, shape=shape)


def _blocks(
    size: Sequence[int], kernel: Sequence[int], dilation: Sequence[int], padding: Sequence[int],
    stride: Sequence[int],
) -> tuple[torch.Tensor, list[int]]:  # fmt: skip
    """Flat positions in the padded (H+2p, W+2p) plane of every block element: (kh*kw, L)."""
    (h, w), (kh, kw), (dh, dw), (ph, pw), (sh, sw) = size, kernel, dilation, padding, stride
    hp, wp = h + 2 * ph, w + 2 * pw
    oh, ow = (hp - dh * (kh - 1) - 1) // sh + 1, (wp - dw * (kw - 1) - 1) // sw + 1
    if oh <= 0 or ow <= 0:
        raise LoweringError(f"unfold/fold: no block fits in {size} with kernel {list(kernel)}")
    rows = (torch.arange(kh) * dh)[:, None, None, None] + (torch.arange(oh) * sh)[None, None, :, None]
    cols = (torch.arange(kw) * dw)[None, :, None, None] + (torch.arange(ow) * sw)[None, None, None, :]
    return (rows * wp + cols).reshape(kh * kw, oh * ow), [hp, wp]


def _padded(b: Builder, x: Value, padding: Sequence[int]) -> Value:
    ph, pw = (int(p) for p in padding)
    if ph == 0 and pw == 0:
        return x
    pads = [(0, 0)] * (x.rank - 2) + [(ph, ph), (pw, pw)]
    shape = (*dims_of(x)[:-2], dims_of(x)[-2] + 2 * ph, dims_of(x)[-1] + 2 * pw)
    return b.call(
        "pad", [x], {"padding": pads, "border": "constant", "value": 0.0}, dtype=x.dtype, shape=shape
    )


@rule("aten::im2col")
def im2col(
    b: Builder, x: Value, kernel_size: Sequence[int], dilation: Sequence[int], padding: Sequence[int],
    stride: Sequence[int],
) -> Value:  # fmt: skip
    """im2col(Tensor self, int[2] kernel_size, int[2] dilation, int[2] padding, int[2] stride) -> Tensor

    ``F.unfold``: (N, C, H, W) → (N, C·kh·kw, L), one gather from the zero-padded plane.
    """
    *lead, c, h, w = dims_of(x)
    index, (hp, wp) = _blocks((h, w), kernel_size, dilation, padding, stride)
    flat = reshape(b, _padded(b, x, padding), [*lead, c, hp * wp])
    picked = gather_axis(b, flat, constant(index), len(lead) + 1)  # (*lead, C, kh*kw, L)
    return reshape(b, picked, [*lead, c * index.shape[0], index.shape[1]])


@rule("aten::col2im")
def col2im(
    b: Builder, x: Value, output_size: Sequence[int], kernel_size: Sequence[int], dilation: Sequence[int],
    padding: Sequence[int], stride: Sequence[int],
) -> Value:  # fmt: skip
    """col2im(Tensor self, SymInt[2] output_size, int[2] kernel_size, int[2] dilation, int[2] padding, int[2] stride) -> Tensor

    ``F.fold``: the blocks (N, C·kh·kw, L) summed into (N, C, H, W) by one scatter-add.
    """  # noqa: E501
    *lead, ckk, n_blocks = dims_of(x)
    index, (hp, wp) = _blocks(output_size, kernel_size, dilation, padding, stride)
    k = index.shape[0]
    if ckk % k or index.shape[1] != n_blocks:
        raise LoweringError(f"fold: input {dims_of(x)} does not match kernel {list(kernel_size)} blocks")
    c = ckk // k
    upd = reshape(b, x, [*lead, c, k * n_blocks])
    positions = index.reshape(1, -1).expand(*([1] * len(lead)), c, k * n_blocks).expand(*lead, c, -1)
    plane = filled(b, 0, [*lead, c, hp * wp], x.dtype)
    summed = scatter_elements(b, plane, len(lead) + 1, constant(positions.contiguous()), upd, "add")
    y = reshape(b, summed, [*lead, c, hp, wp])
    (ph, pw), (h, w) = (int(p) for p in padding), (int(s) for s in output_size)
    return slice_dim(b, slice_dim(b, y, y.rank - 2, ph, ph + h), y.rank - 1, pw, pw + w)


@rule("aten::affine_grid_generator")
def affine_grid_generator(b: Builder, theta: Value, size: Sequence[Dim], align_corners: bool) -> Value:
    """affine_grid_generator(Tensor theta, SymInt[] size, bool align_corners) -> Tensor

    2-D only (``size`` = N, C, H, W): ``grid[n, h, w] = theta[n] · (x_w, y_h, 1)`` with the
    normalized pixel centres of ``F.affine_grid``, as broadcasts of three theta columns over the
    x and y coordinate vectors (symbolic H and W stay symbolic). What ``jit`` records for
    ``F.affine_grid``; ``fx`` and ``export`` see its decomposition.
    """
    if len(size) != 4:
        raise LoweringError(f"affine_grid_generator: only 2-D grids (size N, C, H, W), got {len(size)}-D")
    _, _, height, width = size
    dtype = theta.dtype or torch.float32
    xs = reshape(b, _normalized(b, width, align_corners, dtype), [1, 1, width, 1])
    ys = reshape(b, _normalized(b, height, align_corners, dtype), [1, height, 1, 1])
    n = dims_of(theta)[0]
    columns = [reshape(b, slice_dim(b, theta, 2, k, k + 1), [n, 1, 1, 2]) for k in range(3)]
    grid = binary(b, "add", binary(b, "mul", xs, columns[0]), binary(b, "mul", ys, columns[1]))
    return binary(b, "add", grid, columns[2])


def _normalized(b: Builder, length: Dim, align_corners: bool, dtype: torch.dtype) -> Value:
    """Pixel positions in [-1, 1] along an axis of ``length``: ``(2i + 1) / L − 1`` (centres) or
    ``2i / (L − 1) − 1`` (corners, ``align_corners``), as torch's ``linspace_from_neg_one``."""
    if isinstance(length, int):
        i = torch.arange(length, dtype=torch.float64)
        if length <= 1:
            return constant(torch.zeros(length, dtype=dtype))
        pos = 2 * i / (length - 1) - 1 if align_corners else (2 * i + 1) / length - 1
        return constant(pos.to(dtype))
    index = b.call("tract_core_range", [0, length, 1], dtype=torch.int64, shape=(length,))
    index = b.call("tract_core_cast", [index], {"to": "i64"}, dtype=torch.int64, shape=(length,))
    twice = binary(b, "mul", cast(b, index, dtype), 2.0)
    size = size_tensor(b, length, dtype)
    if align_corners:
        return binary(b, "sub", binary(b, "div", twice, binary(b, "sub", size, 1.0)), 1.0)
    return binary(b, "sub", binary(b, "div", binary(b, "add", twice, 1.0), size), 1.0)

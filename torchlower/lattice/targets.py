"""Eager compute of the ops that write onto an explicit or generated support: target convs,
weight-normalized convs, pool transpose and trilinear upsampling.

Built on the kernel machinery of the convs (``kernels.transpose_map`` / ``apply_conv`` /
``apply_pool``), never on new per-row loops. Geometry in logical coordinates ``c = C / S``:
- ``conv(x, target)``: target row ``o`` (stride ``S·s``) reads input ``c`` through offset ``k``
  when ``o·s = c + p − k·d`` — the transposed relation read the other way;
- ``conv_transpose(x, target)``: target row ``c`` (stride ``S / s``) reads input ``o`` when
  ``o·s = c + p − k·d``;
- a generated transposed support is every ``o·s − p + k·d``;
- normalized: ``conv(x, W) / sqrt(conv(1, W²) + eps) + b``, except pointwise geometry (1×1×1,
  stride 1, no padding or dilation), which is the plain conv (the reference's contract).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from torchlower.errors import InvalidArgumentError
from torchlower.lattice import kernels
from torchlower.lattice.sparse import SparseTensor, Triple, kernel_offsets, merge_supports, unique_coords


def _mul(a: Sequence[int], b: Sequence[int]) -> Triple:
    return tuple(x * y for x, y in zip(a, b, strict=True))  # type: ignore[return-value]


def _div(a: Sequence[int], b: Sequence[int], what: str) -> Triple:
    if any(x % y for x, y in zip(a, b, strict=True)):
        raise InvalidArgumentError(f"{what}: stride {tuple(b)} does not divide the input stride {tuple(a)}")
    return tuple(x // y for x, y in zip(a, b, strict=True))  # type: ignore[return-value]


def _check_target(target: SparseTensor, stride: Triple, what: str) -> None:
    if not isinstance(target, SparseTensor):
        raise InvalidArgumentError(f"{what}: the target must be a SparseTensor, got {type(target).__name__}")
    if target.stride != stride:
        raise InvalidArgumentError(
            f"{what}: the target has stride {target.stride}, the output needs {stride}"
        )


def target_conv_map(
    x: SparseTensor, target: SparseTensor, kernel: Triple, stride: Triple, padding: Triple, dilation: Triple
) -> kernels.KernelMap:
    """The strided conv's map onto ``target``'s rows: the transposed map from ``target`` onto
    ``x``'s voxels, with inputs and outputs swapped."""
    out_stride = _mul(x.stride, stride)
    _check_target(target, out_stride, "conv(x, target)")
    back = kernels.transpose_map(target.coords, out_stride, x.coords, kernel, stride, padding, dilation)
    pairs = []
    for k, o_idx, c_idx in back.pairs:  # back: target row o feeds x row c
        order = torch.argsort(c_idx, stable=True)
        pairs.append((k, c_idx[order], o_idx[order]))
    return kernels.KernelMap(target.coords, out_stride, tuple(pairs))


def target_transpose_map(
    x: SparseTensor, target: SparseTensor, kernel: Triple, stride: Triple, padding: Triple, dilation: Triple
) -> kernels.KernelMap:
    _check_target(target, _div(x.stride, stride, "conv_transpose(x, target)"), "conv_transpose(x, target)")
    return kernels.transpose_map(x.coords, x.stride, target.coords, kernel, stride, padding, dilation)


def generated_support(
    x: SparseTensor, kernel: Triple, stride: Triple, padding: Triple, dilation: Triple
) -> torch.Tensor:
    """Every ``o·s − p + k·d`` (physical, at stride ``S / s``), in (batch, x, y, z) order."""
    out_stride = torch.tensor(_div(x.stride, stride, "transposed support"))
    offs = kernel_offsets(kernel) * torch.tensor(dilation) - torch.tensor(padding)  # [K, 3]
    logical = x.coords[:, 1:].long() // torch.tensor(x.stride) * torch.tensor(stride)  # [N, 3]
    spatial = (logical.unsqueeze(1) + offs.unsqueeze(0)) * out_stride  # [N, K, 3]
    batch = x.coords[:, :1].long().unsqueeze(1).expand(-1, len(offs), -1)
    return unique_coords(torch.cat([batch, spatial], dim=2).reshape(-1, 4))[0]


def onto(
    x: SparseTensor, kmap: kernels.KernelMap, feats: torch.Tensor, *others: SparseTensor
) -> SparseTensor:
    """A result on ``kmap``'s output support (supports of ``x`` and ``others`` remembered)."""
    return SparseTensor(
        feats, kmap.out_coords, kmap.out_stride, supports=merge_supports(x, *others), check=False
    )


def pointwise(kernel: Triple, stride: Triple, padding: Triple, dilation: Triple) -> bool:
    return kernel == (1, 1, 1) and stride == (1, 1, 1) and padding == (0, 0, 0) and dilation == (1, 1, 1)


def normalized_conv(
    feats: torch.Tensor,
    kmap: kernels.KernelMap,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
    plain: bool,
) -> torch.Tensor:
    """``conv(x, W) / sqrt(conv(1, W²) + eps) + b`` on one map (``plain``: pointwise, no division)."""
    if plain:
        return kernels.apply_conv(feats, kmap, weight, bias)
    num = kernels.apply_conv(feats, kmap, weight, None)
    den = kernels.apply_conv(torch.ones_like(feats), kmap, weight * weight, None)
    out = num / torch.sqrt(den + eps)
    return out + bias if bias is not None else out


def pool_transpose(
    x: SparseTensor,
    target: SparseTensor | None,
    kernel: Triple,
    stride: Triple,
    padding: Triple,
    dilation: Triple,
) -> SparseTensor:
    """Average of the coarse rows each fine row came from (zeros where none)."""
    out_stride = _div(x.stride, stride, "PoolTranspose3d")
    if target is None:
        coords = generated_support(x, kernel, stride, padding, dilation)
    else:
        _check_target(target, out_stride, "PoolTranspose3d(x, target)")
        coords = target.coords
    kmap = kernels.transpose_map(x.coords, x.stride, coords, kernel, stride, padding, dilation)
    others = (target,) if target is not None else ()
    return onto(x, kmap, kernels.apply_pool(x.feats, kmap, "avg"), *others)


def tent_weights(stride: Triple) -> torch.Tensor:
    """Per offset of the ``2s − 1`` kernel: product over axes of ``1 − |k − (s − 1)| / s``."""
    axes = [
        torch.tensor([1 - abs(k - (s - 1)) / s for k in range(2 * s - 1)], dtype=torch.float64)
        for s in stride
    ]
    return torch.einsum("i,j,k->ijk", *axes).reshape(-1)


def trilinear_upsample(x: SparseTensor, target: SparseTensor | None, stride: Triple) -> SparseTensor:
    """Tent-weighted average of the coarse neighbours, weights normalized over those present."""
    kernel: Triple = tuple(2 * s - 1 for s in stride)  # type: ignore[assignment]
    padding: Triple = tuple(s - 1 for s in stride)  # type: ignore[assignment]
    out_stride = _div(x.stride, stride, "TrilinearUpsample3d")
    if target is None:
        coords = generated_support(x, kernel, stride, padding, (1, 1, 1))
    else:
        _check_target(target, out_stride, "TrilinearUpsample3d(x, target)")
        coords = target.coords
    kmap = kernels.transpose_map(x.coords, x.stride, coords, kernel, stride, padding, (1, 1, 1))
    weights = tent_weights(stride).to(x.feats.dtype)
    total = x.feats.new_zeros(kmap.rows, x.num_channels)
    norm = x.feats.new_zeros(kmap.rows)
    for k, in_idx, out_idx in kmap.pairs:
        total.index_add_(0, out_idx, x.feats[in_idx] * weights[k])
        norm.index_add_(0, out_idx, weights[k].expand(len(out_idx)))
    present = (norm > 0).unsqueeze(1)
    feats = torch.where(present, total / torch.where(present, norm.unsqueeze(1), 1.0), total)
    others = (target,) if target is not None else ()
    return onto(x, kmap, feats, *others)

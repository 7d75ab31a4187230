"""Sparse modules in plain PyTorch. Conv weights are stored in the artifact's layout,
``[O, kx, ky, kz, I]`` (offsets x-major, z fastest), so lowering writes them unchanged.

Kernel maps are cached on the input's coordinate set (``SparseTensor.cache``), so layers with
the same geometry on the same voxels share one map, and a ``ConvTranspose3d`` inverts the map of
the ``Conv3d`` it undoes instead of searching again.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from torchlower.errors import InvalidArgumentError
from torchlower.lattice import kernels, targets
from torchlower.lattice.sparse import SparseTensor, Triple, coord_cache, triple

IntOr3 = int | Sequence[int]


def _cached(
    x: SparseTensor, build: Callable[..., kernels.KernelMap], *args: Any, **extra: Any
) -> kernels.KernelMap:
    """``build(x.coords, x.stride, *args, **extra)``, computed once per voxel set (``x.cache``).
    Tensor arguments key by identity; ``(key, "tensors")`` keeps them so a reused id cannot match."""
    tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
    key = (build.__name__, *(id(a) if isinstance(a, torch.Tensor) else a for a in args))
    kmap = x.cache.get(key)
    held = x.cache.get((key, "tensors"), ())
    if kmap is not None and len(held) == len(tensors) and all(map(operator.is_, held, tensors)):
        return kmap
    kmap = x.cache[key] = build(x.coords, x.stride, *args, **extra)
    if tensors:
        x.cache[(key, "tensors")] = tensors
    return kmap


def _inverted(x: SparseTensor, target: torch.Tensor, geometry: tuple) -> kernels.KernelMap | None:
    """The cached map of the conv from ``target`` with ``geometry`` whose outputs are ``x``'s."""
    conv = coord_cache(target).get(("conv_map", *geometry))
    if conv is not None and (conv.out_coords is x.coords or torch.equal(conv.out_coords, x.coords)):
        return conv
    return None


class ConvBase(nn.Module):
    """Weight ``[O, kx, ky, kz, I]`` and optional bias, initialised like ``nn.Conv3d``."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOr3, bias: bool) -> None:
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size: Triple = triple(kernel_size, "kernel_size")
        self.weight = nn.Parameter(torch.empty(out_channels, *self.kernel_size, in_channels))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        fan_in = in_channels * math.prod(self.kernel_size)
        bound = 1 / math.sqrt(fan_in)
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -bound, bound)

    def _features(self, feats: torch.Tensor, kmap: kernels.KernelMap) -> torch.Tensor:
        return kernels.apply_conv(feats, kmap, self.weight, self.bias)

    def _run(self, x: SparseTensor, kmap: kernels.KernelMap) -> SparseTensor:
        if x.num_channels != self.in_channels:
            raise InvalidArgumentError(
                f"{type(self).__name__} expects {self.in_channels} channels, got {x.num_channels}"
            )
        feats = self._features(x.feats, kmap)
        if kmap.out_coords is x.coords:
            return x.replace(feats)
        return SparseTensor(feats, kmap.out_coords, kmap.out_stride, supports=x.supports, check=False)


class SubmConv3d(ConvBase):
    """Submanifold conv: the output keeps the input's voxels (centered kernel)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: IntOr3 = 3,
        dilation: IntOr3 = 1,
        bias: bool = False,
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, bias)
        self.dilation: Triple = triple(dilation, "dilation")

    def forward(self, x: SparseTensor) -> SparseTensor:
        return self._run(x, _cached(x, kernels.subm_map, self.kernel_size, self.dilation))


class Conv3d(ConvBase):
    """Strided sparse conv: outputs at ``o`` with ``o·s = c + p − k·d`` (stride multiplies)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: IntOr3,
        stride: IntOr3 = 1,
        padding: IntOr3 = 0,
        dilation: IntOr3 = 1,
        bias: bool = False,
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, bias)
        self.stride, self.padding = triple(stride, "stride"), triple(padding, "padding")
        self.dilation = triple(dilation, "dilation")

    def forward(self, x: SparseTensor, target: SparseTensor | None = None) -> SparseTensor:
        """``conv(x)`` creates its output support; ``conv(x, target)`` writes onto ``target``'s."""
        geometry = (self.kernel_size, self.stride, self.padding, self.dilation)
        if target is not None:
            return self._run(x, targets.target_conv_map(x, target, *geometry))
        return self._run(x, _cached(x, kernels.conv_map, *geometry))


class ConvTranspose3d(Conv3d):
    """Inverse of a ``Conv3d`` with the same geometry: the output is the support that conv read,
    or ``target``'s when called as ``conv(x, target)``."""

    def forward(self, x: SparseTensor, target: SparseTensor | None = None) -> SparseTensor:  # type: ignore[override]
        if target is not None:
            geometry = (self.kernel_size, self.stride, self.padding, self.dilation)
            return self._run(x, targets.target_transpose_map(x, target, *geometry))
        if any(a % b for a, b in zip(x.stride, self.stride, strict=True)):
            raise InvalidArgumentError(
                f"ConvTranspose3d stride {self.stride} does not divide input stride {x.stride}"
            )
        target_stride = tuple(a // b for a, b in zip(x.stride, self.stride, strict=True))
        target = x.supports.get(target_stride)  # type: ignore[arg-type]
        if target is None:
            raise InvalidArgumentError(
                f"ConvTranspose3d needs the support at stride {target_stride}, which this tensor never had "
                f"(known: {sorted(x.supports)}); use GenerativeConvTranspose3d to create voxels"
            )
        geometry = (self.kernel_size, self.stride, self.padding, self.dilation)
        conv = _inverted(x, target, geometry)
        return self._run(x, _cached(x, kernels.transpose_map, target, *geometry, conv=conv))


class GenerativeConvTranspose3d(ConvBase):
    """Transposed conv that creates every ``o·s + k`` (the output stride is divided by ``s``)."""

    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: IntOr3, stride: IntOr3 = 1, bias: bool = False
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, bias)
        self.stride = triple(stride, "stride")

    def forward(self, x: SparseTensor, target: SparseTensor | None = None) -> SparseTensor:
        """``conv(x, target)``: onto ``target``'s voxels instead (a target transposed conv)."""
        if target is not None:
            geometry = (self.kernel_size, self.stride, (0, 0, 0), (1, 1, 1))
            return self._run(x, targets.target_transpose_map(x, target, *geometry))
        return self._run(x, _cached(x, kernels.generative_map, self.kernel_size, self.stride))


class PoolBase(nn.Module):
    mode = "max"

    def __init__(
        self, kernel_size: IntOr3, stride: IntOr3 | None = None, padding: IntOr3 = 0, dilation: IntOr3 = 1
    ) -> None:
        super().__init__()
        self.kernel_size = triple(kernel_size, "kernel_size")
        self.stride = triple(stride if stride is not None else kernel_size, "stride")
        self.padding, self.dilation = triple(padding, "padding"), triple(dilation, "dilation")

    def forward(self, x: SparseTensor) -> SparseTensor:
        kmap = _cached(x, kernels.conv_map, self.kernel_size, self.stride, self.padding, self.dilation)
        feats = kernels.apply_pool(x.feats, kmap, self.mode)
        return SparseTensor(feats, kmap.out_coords, kmap.out_stride, supports=x.supports, check=False)


class MaxPool3d(PoolBase):
    """Max over the present inputs of each output voxel (strided-conv geometry)."""

    mode = "max"


class AvgPool3d(PoolBase):
    """Mean over the present inputs of each output voxel (absent ones do not count)."""

    mode = "avg"


class SumPool3d(PoolBase):
    """Sum over the present inputs of each output voxel."""

    mode = "sum"


class GlobalPoolBase(nn.Module):
    mode = "avg"

    def __init__(self, batch_size: int | None = None) -> None:
        super().__init__()
        self.batch_size = batch_size

    def forward(self, x: SparseTensor) -> torch.Tensor:
        """Dense ``[B, C]``; an empty batch entry gives zeros."""
        batch = x.coords[:, 0].long()
        size = self.batch_size if self.batch_size is not None else (int(batch.max()) + 1 if len(batch) else 0)
        out = x.feats.new_zeros(size, x.num_channels)
        index = batch.unsqueeze(1).expand(-1, x.num_channels)
        return out.scatter_reduce(
            0, index, x.feats, reduce="mean" if self.mode == "avg" else "amax", include_self=False
        )


class GlobalAvgPool(GlobalPoolBase):
    """Mean of the features of each batch entry → dense ``[B, C]``."""

    mode = "avg"


class GlobalMaxPool(GlobalPoolBase):
    """Max of the features of each batch entry → dense ``[B, C]``."""

    mode = "max"


class BatchNorm(nn.BatchNorm1d):
    """Batch norm over the feature channels of a sparse tensor."""

    def forward(self, x: SparseTensor | torch.Tensor) -> SparseTensor | torch.Tensor:  # type: ignore[override]
        if isinstance(x, SparseTensor):
            return x.replace(super().forward(x.feats))
        return super().forward(x)

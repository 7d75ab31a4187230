"""Weight-normalized convs, pool transpose, trilinear upsampling and elementwise transforms.

The normalized convs are their plain modules with another feature computation on the same
kernel map, so support, caching and the ``conv(x, target)`` forms come with them. Embedding
lookup and RMS norm are ``torch.nn.Embedding`` / ``torch.nn.RMSNorm`` (they have lattice rules).
"""

from __future__ import annotations

import torch
from torch import nn

from torchlower.errors import InvalidArgumentError
from torchlower.lattice import kernels, targets
from torchlower.lattice.modules import ConvTranspose3d, GenerativeConvTranspose3d, IntOr3, SubmConv3d
from torchlower.lattice.sparse import SparseTensor, triple


class NormalizedBase:
    """``conv(x, W) / sqrt(conv(1, W²) + eps) + b``; plain conv for pointwise geometry."""

    eps: float
    weight: torch.Tensor
    bias: torch.Tensor | None
    kernel_size: tuple[int, int, int]

    def _geometry(self) -> tuple[tuple[int, int, int], ...]:
        stride = getattr(self, "stride", (1, 1, 1))
        return (
            self.kernel_size,
            stride,
            getattr(self, "padding", (0, 0, 0)),
            getattr(self, "dilation", (1, 1, 1)),
        )

    def _features(self, feats: torch.Tensor, kmap: kernels.KernelMap) -> torch.Tensor:
        plain = targets.pointwise(*self._geometry())
        return targets.normalized_conv(feats, kmap, self.weight, self.bias, self.eps, plain)


def _eps(eps: float) -> float:
    if not eps > 0:
        raise InvalidArgumentError(f"eps must be positive, got {eps!r}")
    return float(eps)


class NormalizedSubmConv3d(NormalizedBase, SubmConv3d):
    """Submanifold conv normalized by the weights that met a voxel: ``conv(x, W) /
    sqrt(conv(1, W²) + eps) + b`` (input support kept)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: IntOr3 = 3,
        dilation: IntOr3 = 1,
        bias: bool = False,
        eps: float = 1e-5,
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, dilation, bias)
        self.eps = _eps(eps)


class NormalizedConvTranspose3d(NormalizedBase, ConvTranspose3d):
    """Normalized transposed conv onto the support of the conv it inverts (or ``target``'s)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: IntOr3,
        stride: IntOr3 = 1,
        padding: IntOr3 = 0,
        dilation: IntOr3 = 1,
        bias: bool = False,
        eps: float = 1e-5,
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, bias)
        self.eps = _eps(eps)


class NormalizedGenerativeConvTranspose3d(NormalizedBase, GenerativeConvTranspose3d):
    """Normalized transposed conv creating every ``o·s + k`` (or onto ``target``'s voxels)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: IntOr3,
        stride: IntOr3 = 1,
        bias: bool = False,
        eps: float = 1e-5,
    ) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, bias)
        self.eps = _eps(eps)


class PoolTranspose3d(nn.Module):
    """Average-pool transpose: each fine voxel gets the mean of the coarse voxels it pools into.

    The fine support is ``target``'s when given, else every ``o·s − p + k·d``."""

    def __init__(
        self, kernel_size: IntOr3, stride: IntOr3 | None = None, padding: IntOr3 = 0, dilation: IntOr3 = 1
    ) -> None:
        super().__init__()
        self.kernel_size = triple(kernel_size, "kernel_size")
        self.stride = triple(stride if stride is not None else kernel_size, "stride")
        self.padding, self.dilation = triple(padding, "padding"), triple(dilation, "dilation")

    def forward(self, x: SparseTensor, target: SparseTensor | None = None) -> SparseTensor:
        return targets.pool_transpose(x, target, self.kernel_size, self.stride, self.padding, self.dilation)


class TrilinearUpsample3d(nn.Module):
    """Upsample by ``stride``: kernel ``2s − 1``, padding ``s − 1``, tent weights normalized over
    the coarse neighbours present; onto ``target``'s voxels when given."""

    def __init__(self, stride: IntOr3) -> None:
        super().__init__()
        self.stride = triple(stride, "stride")
        if min(self.stride) < 1:
            raise InvalidArgumentError(f"stride must be positive, got {self.stride}")

    def forward(self, x: SparseTensor, target: SparseTensor | None = None) -> SparseTensor:
        return targets.trilinear_upsample(x, target, self.stride)


ELEMENTWISE = {"exp": torch.exp, "round": torch.round}  # the kinds the consumer accepts


class Elementwise(nn.Module):
    """``exp`` or ``round`` (half to even) of the features (or of a dense tensor)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        if kind not in ELEMENTWISE:
            raise InvalidArgumentError(f"elementwise kind must be one of {tuple(ELEMENTWISE)}, got {kind!r}")
        self.kind = kind

    def forward(self, x: SparseTensor | torch.Tensor) -> SparseTensor | torch.Tensor:
        fn = ELEMENTWISE[self.kind]
        return x.replace(fn(x.feats)) if isinstance(x, SparseTensor) else fn(x)

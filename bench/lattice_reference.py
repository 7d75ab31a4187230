"""Helpers of ``bench/lattice_subm_conv.py``: float64 dense references and the spconv adapters.

The references scatter the sparse features into a dense float64 grid, run the dense torch op
(``conv3d``, ``conv_transpose3d``, ``max_pool3d``) and read the result back at the output
voxels — independent of every sparse kernel map, ours and spconv's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from torchlower import lattice as L


@dataclass(frozen=True)
class Grid:
    """A dense box holding a tensor's voxels: ``origin`` (even, so stride-2 parity is kept)."""

    origin: torch.Tensor  # [3] int64, physical
    shape: tuple[int, int, int]  # logical cells at the tensor's stride
    batches: int


def grid_of(x: L.SparseTensor, align: int = 4) -> Grid:
    c = x.coords.long()
    lo = c[:, 1:].min(0).values
    origin = torch.div(lo, align, rounding_mode="floor") * align
    s = torch.tensor(x.stride)
    hi = (c[:, 1:] - origin) // s
    shape = tuple(int(v) + 3 + (int(v) + 3) % 2 for v in hi.max(0).values)
    return Grid(origin, shape, int(c[:, 0].max()) + 1)  # type: ignore[arg-type]


def logical(coords: torch.Tensor, stride: tuple[int, int, int], grid: Grid) -> torch.Tensor:
    return (coords[:, 1:].long() - grid.origin) // torch.tensor(stride)


def dense(x: L.SparseTensor, grid: Grid, fill: float = 0.0) -> torch.Tensor:
    d = torch.full((grid.batches, x.num_channels, *grid.shape), fill, dtype=torch.float64)
    lc = logical(x.coords, x.stride, grid)
    d[x.coords[:, 0].long(), :, lc[:, 0], lc[:, 1], lc[:, 2]] = x.feats.double()
    return d


def sample(d: torch.Tensor, coords: torch.Tensor, stride: tuple[int, int, int], grid: Grid) -> torch.Tensor:
    lc = logical(coords, stride, grid)
    return d[coords[:, 0].long(), :, lc[:, 0], lc[:, 1], lc[:, 2]]


def torch_weight(w: torch.Tensor) -> torch.Tensor:
    """``[O, kx, ky, kz, I]`` → ``conv3d``'s ``[O, I, kx, ky, kz]`` in float64."""
    return w.detach().double().permute(0, 4, 1, 2, 3)


def ref_subm(x: L.SparseTensor, w: torch.Tensor) -> torch.Tensor:
    g = grid_of(x)
    pad = [(k - 1) // 2 for k in w.shape[1:4]]
    return sample(F.conv3d(dense(x, g), torch_weight(w), padding=pad), x.coords, x.stride, g)


def ref_down(x: L.SparseTensor, w: torch.Tensor, out: L.SparseTensor) -> torch.Tensor:
    """Stride-``k`` conv with kernel ``k``, no padding; ``out`` gives the output voxels."""
    g = grid_of(x)
    k = w.shape[1]
    y = F.conv3d(dense(x, g), torch_weight(w), stride=k)
    return _sample_coarse(y, out, x, g)


def _sample_coarse(y: torch.Tensor, out: L.SparseTensor, x: L.SparseTensor, g: Grid) -> torch.Tensor:
    """Read ``y`` (logical cells at ``out``'s stride, same origin) at ``out``'s voxels."""
    lc = (out.coords[:, 1:].long() - g.origin) // torch.tensor(out.stride)
    return y[out.coords[:, 0].long(), :, lc[:, 0], lc[:, 1], lc[:, 2]]


def ref_up(y: L.SparseTensor, w: torch.Tensor, target: L.SparseTensor) -> torch.Tensor:
    """Transposed conv (kernel = stride = ``k``) of ``y`` read at ``target``'s voxels."""
    g = grid_of(target)
    k = w.shape[1]
    gy = Grid(g.origin, tuple(s // k + 1 for s in g.shape), g.batches)  # type: ignore[arg-type]
    dy = dense(y, gy)
    up = F.conv_transpose3d(dy, w.detach().double().permute(4, 0, 1, 2, 3), stride=k)
    return sample(up, target.coords, target.stride, g)


def ref_maxpool(x: L.SparseTensor, k: int, out: L.SparseTensor) -> torch.Tensor:
    g = grid_of(x)
    y = F.max_pool3d(dense(x, g, float("-inf")), k, k)
    return _sample_coarse(y, out, x, g)


def max_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).abs().max()) if len(want) else 0.0


# ---- spconv (optional) ------------------------------------------------------------------------
def spconv_ops(x: L.SparseTensor, weights: dict[str, torch.Tensor]) -> dict[str, object] | None:
    """spconv's modules with our weights, and a maker of fresh ``SparseConvTensor``s of ``x``
    (indices shifted onto a non-negative grid with an even origin); None when not installed."""
    try:
        import spconv.pytorch as sp
    except ImportError:
        return None
    g = grid_of(x)
    idx = torch.cat([x.coords[:, :1], (x.coords[:, 1:] - g.origin.int())], 1).int().contiguous()
    shape = [int(v) for v in g.shape]
    subm = sp.SubMConv3d(32, 32, 3, bias=False, indice_key="subm")
    down = sp.SparseConv3d(32, 32, 2, 2, bias=False, indice_key="down")
    up = sp.SparseInverseConv3d(32, 32, 2, bias=False, indice_key="down")
    pool = sp.SparseMaxPool3d(2, 2)  # spconv refuses to reuse pool indices ("indice key exists")
    gen = sp.SparseConvTranspose3d(32, 32, 2, 2, bias=False)  # creates o·2 + k, like ours
    with torch.no_grad():
        subm.weight.copy_(weights["subm"])
        down.weight.copy_(weights["down"])
        up.weight.copy_(weights["up"])
        gen.weight.copy_(weights["gen"])

    def tensor() -> object:
        return sp.SparseConvTensor(x.feats, idx, shape, g.batches)

    ops = {"subm": subm, "down": down, "up": up, "pool": pool, "gen": gen}
    return {"sp": sp, **ops, "tensor": tensor, "grid": g}


def spconv_rows(result: object, stride: int, grid: Grid) -> tuple[torch.Tensor, torch.Tensor]:
    """spconv result → (our physical coords, features)."""
    ind = result.indices.long()  # type: ignore[attr-defined]
    phys = ind[:, 1:] * stride + grid.origin
    return torch.cat([ind[:, :1], phys], 1).int(), result.features  # type: ignore[attr-defined]


def align_rows(coords: torch.Tensor, feats: torch.Tensor, target: torch.Tensor) -> torch.Tensor | None:
    """``feats`` reordered onto ``target``'s rows; None if the voxel sets differ."""
    if len(coords) != len(target):
        return None
    rows = L.sparse.CoordIndex(coords).lookup(target)
    if bool((rows < 0).any()):
        return None
    return feats[rows]

"""Sparse functions: voxelize / devoxelize, joins (binary ops, cat) and reindexing.

Every public function is *traceable*: called with ``torch.fx`` proxies it records itself as one
``call_function`` node (arguments bound to its signature, defaults filled, all positional), so
the FX front end sees ``voxelize(...)`` and not its internals, however it was imported.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from torchlower.errors import InvalidArgumentError
from torchlower.lattice import sparse
from torchlower.lattice.sparse import CoordIndex, SparseTensor, merge_supports, triple, unique_coords

JOINS = ("inner", "left", "right", "outer")
BINARY_OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "add": torch.add,
    "sub": torch.sub,
    "mul": torch.mul,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
}
DEFAULT_JOIN = {"add": "outer", "sub": "outer", "mul": "inner", "maximum": "inner", "minimum": "inner"}

F = TypeVar("F", bound=Callable[..., Any])


def traceable(fn: F) -> F:
    """Make ``fn`` a single FX node when any argument is a proxy."""
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from torch.fx import Proxy
        from torch.fx.node import map_aggregate

        proxies: list[Proxy] = []
        map_aggregate((args, kwargs), lambda a: proxies.append(a) if isinstance(a, Proxy) else None)
        if proxies:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return proxies[0].tracer.create_proxy(
                "call_function", wrapper, tuple(bound.arguments.values()), {}
            )
        return fn(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _rows(active_rows: torch.Tensor | int, total: int) -> int:
    n = int(active_rows.reshape(-1)[0]) if isinstance(active_rows, torch.Tensor) else int(active_rows)
    if not 0 <= n <= total:
        raise InvalidArgumentError(f"active_rows {n} outside [0, {total}]")
    return n


def _grid(points: torch.Tensor, voxel_size: Sequence[float], origin: Sequence[float]) -> torch.Tensor:
    """Continuous voxel-grid position of each point, ``(p − origin) / voxel_size`` in float64."""
    size = torch.tensor(tuple(voxel_size), dtype=torch.float64)
    return (points.double() - torch.tensor(tuple(origin), dtype=torch.float64)) / size


@traceable
def voxelize(
    points: torch.Tensor,
    feats: torch.Tensor,
    batch_indices: torch.Tensor,
    active_rows: torch.Tensor,
    voxel_size: float | Sequence[float],
    origin: float | Sequence[float] = 0.0,
    reduction: str = "mean",
) -> SparseTensor:
    """Points → voxels at stride 1: voxel ``floor((p − origin) / voxel_size)``, features averaged
    (``"mean"``) or summed (``"sum"``) over the points inside; rows in (batch, x, y, z) order."""
    if reduction not in ("mean", "sum"):
        raise InvalidArgumentError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    n = _rows(active_rows, points.shape[0])
    vs, org = three_floats(voxel_size, "voxel_size"), three_floats(origin, "origin")
    cells = torch.floor(_grid(points[:n], vs, org)).long()
    coords = torch.cat([batch_indices[:n].long().unsqueeze(1), cells], dim=1)
    out_coords, inverse = unique_coords(coords)
    index = inverse.unsqueeze(1).expand(-1, feats.shape[1])
    out = feats.new_zeros(out_coords.shape[0], feats.shape[1])
    out = out.scatter_reduce(
        0, index, feats[:n], reduce="mean" if reduction == "mean" else "sum", include_self=False
    )
    return SparseTensor(out, out_coords, 1, check=False)


@traceable
def devoxelize(
    points: torch.Tensor,
    voxels: SparseTensor,
    batch_indices: torch.Tensor,
    point_active_rows: torch.Tensor,
    voxel_size: float | Sequence[float],
    origin: float | Sequence[float] = 0.0,
    interpolation: str = "linear",
) -> torch.Tensor:
    """Voxels → points ``[N, C]``. ``nearest`` reads voxel ``floor(q + 0.5)``; ``linear`` blends the
    8 corners around ``q`` with trilinear weights, missing corners count as zero (no
    renormalization). ``q`` is the point's grid position in units of the tensor's stride."""
    if interpolation not in ("nearest", "linear"):
        raise InvalidArgumentError(f"interpolation must be 'nearest' or 'linear', got {interpolation!r}")
    n = _rows(point_active_rows, points.shape[0])
    stride = torch.tensor(voxels.stride, dtype=torch.float64)
    q = _grid(points[:n], three_floats(voxel_size, "voxel_size"), three_floats(origin, "origin")) / stride
    batch = batch_indices[:n].long().unsqueeze(1)
    index = CoordIndex(voxels.coords)
    out = voxels.feats.new_zeros(points.shape[0], voxels.num_channels)
    if interpolation == "nearest":
        cell = torch.floor(q + 0.5).long() * stride.long()
        rows = index.lookup(torch.cat([batch, cell], dim=1))
        hit = rows >= 0
        out[:n][hit] = voxels.feats[rows[hit]]
        return out
    base = torch.floor(q)
    frac = q - base
    acc = torch.zeros(n, voxels.num_channels, dtype=torch.float64)
    for corner in range(8):
        bits = torch.tensor([(corner >> 2) & 1, (corner >> 1) & 1, corner & 1])
        weight = torch.where(bits.bool(), frac, 1 - frac).prod(dim=1)
        cell = (base.long() + bits) * stride.long()
        rows = index.lookup(torch.cat([batch, cell], dim=1))
        hit = rows >= 0
        acc[hit] += weight[hit].unsqueeze(1) * voxels.feats[rows[hit]].double()
    out[:n] = acc.to(out.dtype)
    return out


def three_floats(value: float | Sequence[float], what: str) -> tuple[float, float, float]:
    if isinstance(value, (int, float)):
        return (float(value),) * 3  # type: ignore[return-value]
    items = tuple(float(v) for v in value)
    if len(items) != 3:
        raise InvalidArgumentError(f"{what} must be a float or 3 floats, got {value!r}")
    return items  # type: ignore[return-value]


# ---- joins ------------------------------------------------------------------------------------
def align(tensors: Sequence[SparseTensor], join: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Output coordinates of ``join`` over ``tensors`` and, per tensor, its row for each output
    row (−1 where the tensor has no voxel). left/right keep the first/last tensor's row order;
    inner/outer are in (batch, x, y, z) order."""
    if join not in JOINS:
        raise InvalidArgumentError(f"join must be one of {JOINS}, got {join!r}")
    strides = {t.stride for t in tensors}
    if len(strides) != 1:
        raise InvalidArgumentError(f"sparse operands must share one stride, got {sorted(strides)}")
    if join in ("left", "right"):
        out = tensors[0 if join == "left" else -1].coords
    else:
        out, _ = unique_coords(torch.cat([t.coords for t in tensors]))
    rows = [CoordIndex(t.coords).lookup(out) for t in tensors]
    if join == "inner":
        keep = torch.stack([r >= 0 for r in rows]).all(dim=0)
        out, rows = out[keep], [r[keep] for r in rows]
    return out, rows


def gather_fill(feats: torch.Tensor, rows: torch.Tensor, fill: float) -> torch.Tensor:
    picked = feats[rows.clamp(min=0)]
    return torch.where((rows >= 0).unsqueeze(1), picked, torch.full_like(picked, fill))


def binary(
    op: str, lhs: SparseTensor, rhs: SparseTensor, join: str | None, lhs_fill: float, rhs_fill: float
) -> SparseTensor:
    """Elementwise ``op`` on the joined support; a side without a voxel contributes its fill."""
    if op not in BINARY_OPS:
        raise InvalidArgumentError(f"sparse binary op must be one of {tuple(BINARY_OPS)}, got {op!r}")
    if not isinstance(lhs, SparseTensor) or not isinstance(rhs, SparseTensor):
        raise InvalidArgumentError(
            f"sparse {op} needs two SparseTensors, got {type(lhs).__name__}, {type(rhs).__name__}"
        )
    if lhs.num_channels != rhs.num_channels:
        raise InvalidArgumentError(f"sparse {op}: {lhs.num_channels} vs {rhs.num_channels} channels")
    join = join or DEFAULT_JOIN[op]
    if lhs.coords is rhs.coords:  # same support object: no alignment needed
        return lhs.replace(BINARY_OPS[op](lhs.feats, rhs.feats))
    coords, (ra, rb) = align([lhs, rhs], join)
    feats = BINARY_OPS[op](gather_fill(lhs.feats, ra, lhs_fill), gather_fill(rhs.feats, rb, rhs_fill))
    return SparseTensor(feats, coords, lhs.stride, supports=merge_supports(lhs, rhs), check=False)


@traceable
def add(
    lhs: SparseTensor,
    rhs: SparseTensor,
    join: str | None = None,
    lhs_fill: float = 0.0,
    rhs_fill: float = 0.0,
) -> SparseTensor:
    """Sparse ``lhs + rhs`` (default join: outer)."""
    return binary("add", lhs, rhs, join, lhs_fill, rhs_fill)


@traceable
def sub(
    lhs: SparseTensor,
    rhs: SparseTensor,
    join: str | None = None,
    lhs_fill: float = 0.0,
    rhs_fill: float = 0.0,
) -> SparseTensor:
    """Sparse ``lhs − rhs`` (default join: outer)."""
    return binary("sub", lhs, rhs, join, lhs_fill, rhs_fill)


@traceable
def mul(
    lhs: SparseTensor,
    rhs: SparseTensor,
    join: str | None = None,
    lhs_fill: float = 0.0,
    rhs_fill: float = 0.0,
) -> SparseTensor:
    """Sparse ``lhs · rhs`` (default join: inner)."""
    return binary("mul", lhs, rhs, join, lhs_fill, rhs_fill)


@traceable
def maximum(
    lhs: SparseTensor,
    rhs: SparseTensor,
    join: str | None = None,
    lhs_fill: float = 0.0,
    rhs_fill: float = 0.0,
) -> SparseTensor:
    """Sparse elementwise maximum (default join: inner)."""
    return binary("maximum", lhs, rhs, join, lhs_fill, rhs_fill)


@traceable
def minimum(
    lhs: SparseTensor,
    rhs: SparseTensor,
    join: str | None = None,
    lhs_fill: float = 0.0,
    rhs_fill: float = 0.0,
) -> SparseTensor:
    """Sparse elementwise minimum (default join: inner)."""
    return binary("minimum", lhs, rhs, join, lhs_fill, rhs_fill)


@traceable
def cat(tensors: Sequence[SparseTensor], join: str = "inner") -> SparseTensor:
    """Concatenate features along channels on the joined support (missing rows are zeros)."""
    tensors = list(tensors)
    if len(tensors) < 2:
        raise InvalidArgumentError(f"cat needs at least two sparse tensors, got {len(tensors)}")
    if all(t.coords is tensors[0].coords for t in tensors):
        return tensors[0].replace(torch.cat([t.feats for t in tensors], dim=1))
    coords, rows = align(tensors, join)
    feats = torch.cat([gather_fill(t.feats, r, 0.0) for t, r in zip(tensors, rows, strict=True)], dim=1)
    return SparseTensor(feats, coords, tensors[0].stride, supports=merge_supports(*tensors), check=False)


@traceable
def reindex_sparse(source: SparseTensor, target: SparseTensor, fill: float = 0.0) -> SparseTensor:
    """``source``'s features on ``target``'s voxels (rows and order of ``target``); ``fill`` where
    ``source`` has no voxel. Both must share a stride."""
    if source.stride != target.stride:
        raise InvalidArgumentError(f"reindex_sparse: strides {source.stride} and {target.stride} differ")
    rows = CoordIndex(source.coords).lookup(target.coords)
    return target.replace(gather_fill(source.feats, rows, fill))


def strides_of(value: int | Sequence[int]) -> tuple[int, int, int]:
    return triple(value, "stride")


sparse.ARITHMETIC.update(add=add, sub=sub, mul=mul)  # SparseTensor's +, -, * (see sparse.py)

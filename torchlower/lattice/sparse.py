"""``SparseTensor`` and the coordinate machinery every sparse op shares.

Coordinates are int32 ``[N, 4]`` rows ``(batch, x, y, z)`` in *physical* units: a tensor at
stride ``s`` only has coordinates divisible by ``s``. Lookups hash coordinates into int64 keys
(mixed radix over the observed range, batch most significant, so key order is lexicographic
order) and read a dense int32 grid over that range when it is small (at most 128 bytes a row),
else ``sort`` + ``searchsorted``: no Python loop ever runs over rows. Kernel maps are cached
per coordinate tensor (``coord_cache``).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from torchlower.errors import InvalidArgumentError

Triple = tuple[int, int, int]


def triple(value: int | Sequence[int], what: str) -> Triple:
    """``3`` → ``(3, 3, 3)``; a 3-sequence stays; anything else is an error naming ``what``."""
    if isinstance(value, int):
        return (value, value, value)
    items = tuple(int(v) for v in value)
    if len(items) != 3:
        raise InvalidArgumentError(f"{what} must be an int or 3 ints, got {value!r}")
    return items  # type: ignore[return-value]


# ``sparse ± sparse`` and ``sparse · sparse`` are the traceable ``lattice.functional`` add / sub /
# mul (recorded as one FX node when the other operand is a proxy); functional registers them here
# when it loads, which the ``torchlower.lattice`` package does before anything else, so this
# module need not import functional back
ARITHMETIC: dict[str, Callable[[SparseTensor, SparseTensor], SparseTensor]] = {}


class SparseTensor:
    """Features ``[N, C]`` on active voxels ``coords [N, 4]`` at a per-axis ``stride``.

    ``supports`` maps each stride seen on the way here to the coordinates at that stride, so a
    transposed conv can restore the support of the conv it inverts. ``cache`` holds kernel maps;
    it belongs to the coordinate tensor (``coord_cache``), so every tensor on the same voxels —
    and every layer with the same geometry — shares one map.
    """

    def __init__(
        self,
        feats: torch.Tensor,
        coords: torch.Tensor,
        stride: int | Sequence[int] = 1,
        *,
        supports: dict[Triple, torch.Tensor] | None = None,
        cache: dict[object, Any] | None = None,
        check: bool = True,
    ) -> None:
        if feats.dim() != 2 or coords.dim() != 2 or coords.shape[1] != 4 or coords.shape[0] != feats.shape[0]:
            raise InvalidArgumentError(
                f"SparseTensor needs feats [N, C] and coords [N, 4]; got {tuple(feats.shape)} and "
                f"{tuple(coords.shape)}"
            )
        self.feats = feats
        self.coords = coords.to(torch.int32)
        self.stride = triple(stride, "stride")
        if check:
            check_divisible(self.coords, self.stride)
        self.supports = dict(supports or {})
        self.supports[self.stride] = self.coords
        self.cache = cache if cache is not None else coord_cache(self.coords)

    # ---- aliases and facts --------------------------------------------------------------
    @property
    def F(self) -> torch.Tensor:
        return self.feats

    @property
    def C(self) -> torch.Tensor:
        return self.coords

    @property
    def num_channels(self) -> int:
        return int(self.feats.shape[1])

    def batch_counts(self, batch_size: int | None = None) -> torch.Tensor:
        """Active rows per batch entry (length ``batch_size``, default max batch + 1)."""
        b = self.coords[:, 0].long()
        size = batch_size if batch_size is not None else (int(b.max()) + 1 if len(b) else 0)
        return torch.bincount(b, minlength=size)[:size]

    def replace(self, feats: torch.Tensor) -> SparseTensor:
        """Same voxels, new features (row count must match)."""
        if feats.shape[0] != self.feats.shape[0]:
            raise InvalidArgumentError(f"{feats.shape[0]} feature rows for {self.feats.shape[0]} voxels")
        return SparseTensor(
            feats, self.coords, self.stride, supports=self.supports, cache=self.cache, check=False
        )

    def __repr__(self) -> str:
        return (
            f"SparseTensor(rows={self.coords.shape[0]}, channels={self.num_channels}, stride={self.stride})"
        )

    # ---- operators and torch functions on features --------------------------------------
    def __add__(self, other: object) -> SparseTensor:
        if _is_number(other):
            return self.replace(self.feats + other)  # type: ignore[operator]
        return ARITHMETIC["add"](self, other)  # type: ignore[arg-type]

    def __sub__(self, other: object) -> SparseTensor:
        if _is_number(other):
            return self.replace(self.feats - other)  # type: ignore[operator]
        return ARITHMETIC["sub"](self, other)  # type: ignore[arg-type]

    def __mul__(self, other: object) -> SparseTensor:
        if _is_number(other):
            return self.replace(self.feats * other)  # type: ignore[operator]
        return ARITHMETIC["mul"](self, other)  # type: ignore[arg-type]

    # a number on the left, division and negation act on the features
    def __radd__(self, other: float) -> SparseTensor:
        return self.replace(other + self.feats)

    def __rsub__(self, other: float) -> SparseTensor:
        return self.replace(other - self.feats)

    def __rmul__(self, other: float) -> SparseTensor:
        return self.replace(other * self.feats)

    def __truediv__(self, other: float) -> SparseTensor:
        return self.replace(self.feats / other)

    def __neg__(self) -> SparseTensor:
        return self.replace(-self.feats)

    @classmethod
    def __torch_function__(
        cls, func: Any, types: Any, args: Sequence[Any] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        """Dense torch functions (relu, linear, layer_norm, …) act on the features."""
        sparse = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, SparseTensor)]
        source = sparse[0]
        if any(s.coords is not source.coords for s in sparse[1:]):  # rows would not line up
            raise InvalidArgumentError(
                f"{getattr(func, '__name__', func)} of SparseTensors on different voxels; join them with"
                " torchlower.lattice.add / sub / mul / maximum / minimum / cat"
            )
        unwrapped = [a.feats if isinstance(a, SparseTensor) else a for a in args]
        out = func(*unwrapped, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.dim() == 2 and out.shape[0] == source.feats.shape[0]:
            return source.replace(out)
        return out


_CACHES: dict[int, tuple[weakref.ref, dict[object, Any]]] = {}


def coord_cache(coords: torch.Tensor) -> dict[object, Any]:
    """The kernel-map cache of a coordinate tensor (by identity), dropped when it is freed."""
    key = id(coords)
    entry = _CACHES.get(key)
    if entry is not None and entry[0]() is coords:
        return entry[1]

    def forget(ref: weakref.ref, caches: dict = _CACHES) -> None:  # bound now: at exit globals are None
        if key in caches and caches[key][0] is ref:
            del caches[key]

    cache: dict[object, Any] = {}
    _CACHES[key] = (weakref.ref(coords, forget), cache)
    return cache


def _is_number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_divisible(coords: torch.Tensor, stride: Triple) -> None:
    """Physical coordinates at stride ``s`` must be multiples of ``s`` (the consumer's ABI)."""
    if len(coords) and stride != (1, 1, 1):
        bad = coords[:, 1:] % torch.tensor(stride, dtype=coords.dtype) != 0
        if bool(bad.any()):
            row = int(bad.any(dim=1).nonzero()[0])
            raise InvalidArgumentError(
                f"coordinates must be divisible by the stride {stride}; row {row} is {coords[row].tolist()}"
            )


# ---- coordinate hashing ---------------------------------------------------------------------
@dataclass(frozen=True)
class Hash:
    """Mixed-radix int64 keys for coordinates inside ``[lo, hi]`` (per column)."""

    lo: torch.Tensor  # [4] int64
    radix: torch.Tensor  # [4] int64

    @staticmethod
    def covering(coord_sets: Iterable[torch.Tensor], margin: torch.Tensor | None = None) -> Hash:
        """Keys for the sets' range widened by ``margin`` per column (so shifted queries stay
        inside and key arithmetic ``key(c + δ) = key(c) + key(δ)`` holds)."""
        sets = [c.long() for c in coord_sets if len(c)]
        if not sets:
            return Hash(torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.long))
        pad = margin.long() if margin is not None else torch.zeros(4, dtype=torch.long)
        lo = torch.stack([c.min(dim=0).values for c in sets]).min(dim=0).values - pad
        hi = torch.stack([c.max(dim=0).values for c in sets]).max(dim=0).values + pad
        radix = hi - lo + 1
        if float(radix.double().prod()) >= 2**62:
            raise InvalidArgumentError(f"coordinate range {lo.tolist()}..{hi.tolist()} is too large to hash")
        return Hash(lo, radix)

    def inside(self, coords: torch.Tensor) -> torch.Tensor:
        c = coords.long()
        return ((c >= self.lo) & (c < self.lo + self.radix)).all(dim=-1)

    def encode(self, coords: torch.Tensor) -> torch.Tensor:
        c = coords.long() - self.lo
        r = self.radix
        return ((c[..., 0] * r[1] + c[..., 1]) * r[2] + c[..., 2]) * r[3] + c[..., 3]

    def decode(self, keys: torch.Tensor) -> torch.Tensor:
        r = self.radix
        z = keys % r[3]
        rest = keys // r[3]
        y = rest % r[2]
        rest = rest // r[2]
        x = rest % r[1]
        b = rest // r[1]
        return (torch.stack([b, x, y, z], dim=-1) + self.lo).to(torch.int32)


def dense_limit(rows: int) -> int:
    """Largest bounding box (in cells) worth a dense int32 grid: at most 128 bytes per row
    (memory stays linear in the rows), never below 1M cells, always addressable by int32."""
    return min(max(1 << 20, 32 * rows), (1 << 31) - 1)


class CoordIndex:
    """Find rows of a coordinate table: ``lookup(query) -> row index or -1``.

    A dense int32 grid over the hash range when that is small (``dense_limit``): a lookup is
    one gather. Otherwise sorted keys + ``searchsorted``. ``rows_of_keys`` is the kernels' form:
    int32 rows with the sentinel ``size`` (the row count) for absent keys.
    """

    def __init__(self, coords: torch.Tensor, hash_: Hash | None = None) -> None:
        self.hash = hash_ or Hash.covering([coords])
        self.size = int(coords.shape[0])
        self.volume = int(self.hash.radix.prod())
        self.grid: torch.Tensor | None = None
        keys = self.hash.encode(coords)
        if self.volume <= dense_limit(self.size):
            self.grid = torch.full((self.volume,), self.size, dtype=torch.int32)
            self.grid[keys] = torch.arange(self.size, dtype=torch.int32)
            keys = keys.to(torch.int32)
        else:
            self.sorted_keys, order = torch.sort(keys)
            self.order = order.to(torch.int32)
        self.row_keys = keys  # ``keys(coords)`` of the indexed rows, computed once

    def keys(self, coords: torch.Tensor) -> torch.Tensor:
        """Keys of ``coords`` (inside the hash range), int32 when the grid is dense."""
        keys = self.hash.encode(coords)
        return keys.to(torch.int32) if self.grid is not None else keys

    def rows_of_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """int32 row of each key, ``size`` when absent; keys must come from ``self.hash``."""
        if self.grid is not None:
            return self.grid.index_select(0, keys.reshape(-1)).reshape(keys.shape)
        if self.size == 0:
            return torch.zeros(keys.shape, dtype=torch.int32)
        pos = torch.searchsorted(self.sorted_keys, keys).clamp_(max=self.size - 1)
        sentinel = torch.tensor(self.size, dtype=torch.int32)
        return torch.where(self.sorted_keys[pos] == keys, self.order[pos], sentinel)

    def lookup_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """Row of each key (−1 when absent); keys must come from ``self.hash``."""
        rows = self.rows_of_keys(keys.to(torch.int32) if self.grid is not None else keys).long()
        return rows.masked_fill_(rows == self.size, -1)

    def lookup(self, query: torch.Tensor) -> torch.Tensor:
        flat = query.reshape(-1, 4)
        result = torch.full((flat.shape[0],), -1, dtype=torch.long)
        if self.size == 0 or len(flat) == 0:
            return result.reshape(query.shape[:-1])
        ok = self.hash.inside(flat)
        result[ok] = self.lookup_keys(self.hash.encode(flat[ok]))
        return result.reshape(query.shape[:-1])


def unique_keys(keys: torch.Tensor, volume: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted distinct keys in ``[0, volume)`` and each key's position among them. A dense
    mark + cumulative count when the range is small (no sort), else ``torch.unique``."""
    if volume <= dense_limit(len(keys)):
        mark = torch.zeros(volume, dtype=torch.bool)
        mark[keys] = True
        present = mark.nonzero().squeeze(1)
        rank = torch.empty(volume, dtype=torch.int32)
        rank[present] = torch.arange(len(present), dtype=torch.int32)
        return present, rank[keys].long()
    return torch.unique(keys, sorted=True, return_inverse=True)


def unique_coords(coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct coordinates in lexicographic (batch, x, y, z) order and each row's position."""
    if len(coords) == 0:
        return coords.to(torch.int32).reshape(0, 4), torch.zeros(0, dtype=torch.long)
    h = Hash.covering([coords])
    keys, inverse = unique_keys(h.encode(coords), int(h.radix.prod()))
    return h.decode(keys), inverse


def kernel_offsets(kernel: Triple) -> torch.Tensor:
    """All kernel positions ``[K, 3]`` in x-major order with z fastest (the weight order)."""
    grids = torch.meshgrid(*(torch.arange(k) for k in kernel), indexing="ij")
    return torch.stack([g.reshape(-1) for g in grids], dim=1)


def merge_supports(*tensors: SparseTensor) -> dict[Triple, torch.Tensor]:
    merged: dict[Triple, torch.Tensor] = {}
    for t in tensors:
        for stride, coords in t.supports.items():
            merged.setdefault(stride, coords)
    return merged

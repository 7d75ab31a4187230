"""Frozen copy of the sparse kernels as they were before issue 17 (commit 147a5ff): the oracle
the rewritten engine must match exactly (coordinates and row order bit for bit, features to
rounding). Test-only: nothing in ``torchlower`` imports it, and it must never change.
"""

# ruff: noqa
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from torchlower.errors import InvalidArgumentError

Triple = tuple[int, int, int]


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


class CoordIndex:
    """Find rows of a coordinate table: ``lookup(query) -> row index or -1``."""

    def __init__(self, coords: torch.Tensor, hash_: Hash | None = None) -> None:
        self.hash = hash_ or Hash.covering([coords])
        keys = self.hash.encode(coords)
        self.sorted_keys, self.order = torch.sort(keys)

    def lookup_keys(self, keys: torch.Tensor) -> torch.Tensor:
        """Row of each key (−1 when absent); keys must come from ``self.hash``."""
        if len(self.sorted_keys) == 0:
            return torch.full(keys.shape, -1, dtype=torch.long)
        pos = torch.searchsorted(self.sorted_keys, keys).clamp_(max=len(self.sorted_keys) - 1)
        return torch.where(self.sorted_keys[pos] == keys, self.order[pos], -1)

    def lookup(self, query: torch.Tensor) -> torch.Tensor:
        flat = query.reshape(-1, 4)
        result = torch.full((flat.shape[0],), -1, dtype=torch.long)
        if len(self.sorted_keys) == 0 or len(flat) == 0:
            return result.reshape(query.shape[:-1])
        ok = self.hash.inside(flat)
        keys = self.hash.encode(flat[ok])
        pos = torch.searchsorted(self.sorted_keys, keys).clamp_(max=len(self.sorted_keys) - 1)
        found = self.sorted_keys[pos] == keys
        rows = torch.where(found, self.order[pos], torch.full_like(pos, -1))
        result[ok] = rows
        return result.reshape(query.shape[:-1])


def unique_coords(coords: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct coordinates in lexicographic (batch, x, y, z) order and each row's position."""
    if len(coords) == 0:
        return coords.to(torch.int32).reshape(0, 4), torch.zeros(0, dtype=torch.long)
    h = Hash.covering([coords])
    keys, inverse = torch.unique(h.encode(coords), sorted=True, return_inverse=True)
    return h.decode(keys), inverse


def kernel_offsets(kernel: Triple) -> torch.Tensor:
    """All kernel positions ``[K, 3]`` in x-major order with z fastest (the weight order)."""
    grids = torch.meshgrid(*(torch.arange(k) for k in kernel), indexing="ij")
    return torch.stack([g.reshape(-1) for g in grids], dim=1)


@dataclass(frozen=True)
class KernelMap:
    """Pairs ``(k, in_row, out_row)`` grouped by kernel offset, plus the output coordinates."""

    out_coords: torch.Tensor  # [M, 4] int32
    out_stride: Triple
    pairs: tuple[tuple[int, torch.Tensor, torch.Tensor], ...]  # (k, in_idx, out_idx)

    @property
    def rows(self) -> int:
        return int(self.out_coords.shape[0])

    def flat(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.pairs:
            empty = torch.zeros(0, dtype=torch.long)
            return empty, empty
        return torch.cat([p[1] for p in self.pairs]), torch.cat([p[2] for p in self.pairs])


def _t(values: Triple) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


def _group(k_all: torch.Tensor, in_all: torch.Tensor, out_all: torch.Tensor, kernel_size: int) -> tuple:
    """Split flat pair lists into per-offset groups (stable, offsets in weight order)."""
    order = torch.argsort(k_all, stable=True)
    k_sorted, in_sorted, out_sorted = k_all[order], in_all[order], out_all[order]
    counts = torch.bincount(k_sorted, minlength=kernel_size).tolist()
    groups, start = [], 0
    for k, n in enumerate(counts):
        if n:
            groups.append((k, in_sorted[start : start + n], out_sorted[start : start + n]))
        start += n
    return tuple(groups)


def subm_map(coords: torch.Tensor, stride: Triple, kernel: Triple, dilation: Triple) -> KernelMap:
    offs = kernel_offsets(kernel)
    center = (_t(kernel) - 1) // 2
    delta = (offs - center) * _t(dilation) * _t(stride)  # [K, 3] physical
    margin = torch.cat([torch.zeros(1, dtype=torch.long), delta.abs().max(dim=0).values])
    index = CoordIndex(coords, Hash.covering([coords], margin))
    zero = torch.zeros(len(offs), 4, dtype=torch.long)
    zero[:, 1:] = delta
    shift = index.hash.encode(zero + index.hash.lo)  # key(δ): the hash is linear inside its range
    found = index.lookup_keys(index.hash.encode(coords).unsqueeze(0) + shift.unsqueeze(1))  # [K, N]
    k_idx, out_idx = (found >= 0).nonzero(as_tuple=True)
    return KernelMap(coords, stride, _group(k_idx, found[k_idx, out_idx], out_idx, len(offs)))


def conv_map(
    coords: torch.Tensor,
    stride: Triple,
    kernel: Triple,
    conv_stride: Triple,
    padding: Triple,
    dilation: Triple,
) -> KernelMap:
    """Strided conv / pool: every (input, offset) with ``(c + p − k·d) % s == 0`` makes an output."""
    offs = kernel_offsets(kernel)
    logical = coords[:, 1:].long() // _t(stride)  # [N, 3]
    num = logical.unsqueeze(0) + _t(padding) - (offs * _t(dilation)).unsqueeze(1)  # [K, N, 3]
    ok = (num % _t(conv_stride) == 0).all(dim=-1)
    k_idx, in_idx = ok.nonzero(as_tuple=True)
    out_stride = tuple(a * b for a, b in zip(stride, conv_stride, strict=True))
    phys = (num[k_idx, in_idx] // _t(conv_stride)) * _t(out_stride)  # type: ignore[arg-type]
    cand = torch.cat([coords[in_idx, :1].long(), phys], dim=1)
    out_coords, out_idx = unique_coords(cand)
    return KernelMap(out_coords, out_stride, _group(k_idx, in_idx, out_idx, len(offs)))  # type: ignore[arg-type]


def transpose_map(
    coords: torch.Tensor,
    stride: Triple,
    target: torch.Tensor,
    kernel: Triple,
    conv_stride: Triple,
    padding: Triple,
    dilation: Triple,
) -> KernelMap:
    """Inverse of ``conv_map``: input row o feeds target row c when ``o·s = c + p − k·d``."""
    out_stride = tuple(a // b for a, b in zip(stride, conv_stride, strict=True))
    offs = kernel_offsets(kernel)
    logical = coords[:, 1:].long() // _t(stride)
    c = logical.unsqueeze(0) * _t(conv_stride) - _t(padding) + (offs * _t(dilation)).unsqueeze(1)  # [K, N, 3]
    batch = coords[:, :1].long().unsqueeze(0).expand(len(offs), -1, -1)
    query = torch.cat([batch, c * _t(out_stride)], dim=-1)  # type: ignore[arg-type]
    found = CoordIndex(target).lookup(query)
    k_idx, in_idx = (found >= 0).nonzero(as_tuple=True)
    return KernelMap(target, out_stride, _group(k_idx, in_idx, found[k_idx, in_idx], len(offs)))  # type: ignore[arg-type]


def generative_map(coords: torch.Tensor, stride: Triple, kernel: Triple, conv_stride: Triple) -> KernelMap:
    """Generative transposed conv: input o creates ``o·s + k`` at stride ``S / s``."""
    if any(a % b for a, b in zip(stride, conv_stride, strict=True)):
        raise InvalidArgumentError(
            f"generative transposed conv stride {conv_stride} does not divide {stride}"
        )
    out_stride = tuple(a // b for a, b in zip(stride, conv_stride, strict=True))
    offs = kernel_offsets(kernel)
    logical = coords[:, 1:].long() // _t(stride)
    c = logical.unsqueeze(0) * _t(conv_stride) + offs.unsqueeze(1)  # [K, N, 3]
    batch = coords[:, :1].long().unsqueeze(0).expand(len(offs), -1, -1)
    cand = torch.cat([batch, c * _t(out_stride)], dim=-1).reshape(-1, 4)  # type: ignore[arg-type]
    out_coords, out_flat = unique_coords(cand)
    n = coords.shape[0]
    k_idx = torch.arange(len(offs)).repeat_interleave(n)
    in_idx = torch.arange(n).repeat(len(offs))
    return KernelMap(out_coords, out_stride, _group(k_idx, in_idx, out_flat, len(offs)))  # type: ignore[arg-type]


def apply_conv(
    feats: torch.Tensor, kmap: KernelMap, weight: torch.Tensor, bias: torch.Tensor | None, chunk: int = 16384
) -> torch.Tensor:
    """``weight [O, kx, ky, kz, I]``. Each (output, offset) has at most one input, so a row's
    inputs form a ``[K·I]`` vector: gather them (zeros where absent) and do one matmul per
    chunk of rows."""
    out_ch, in_ch = weight.shape[0], weight.shape[-1]
    w = weight.reshape(out_ch, -1).t()  # [K·I, O]
    kernel_size = w.shape[0] // in_ch
    table = torch.full((kmap.rows, kernel_size), feats.shape[0], dtype=torch.long)
    for k, in_idx, out_idx in kmap.pairs:
        table[out_idx, k] = in_idx
    padded = torch.cat([feats, feats.new_zeros(1, in_ch)])
    parts = [padded[rows].reshape(len(rows), -1) @ w for rows in table.split(chunk)]
    out = torch.cat(parts) if parts else feats.new_zeros(0, out_ch)
    return out + bias if bias is not None else out


def apply_pool(feats: torch.Tensor, kmap: KernelMap, mode: str) -> torch.Tensor:
    """Max / average / sum over the inputs each output sees (absent neighbours do not count)."""
    in_idx, out_idx = kmap.flat()
    reduce = {"max": "amax", "avg": "mean", "sum": "sum"}[mode]
    out = feats.new_zeros(kmap.rows, feats.shape[1])
    index = out_idx.unsqueeze(1).expand(-1, feats.shape[1])
    return out.scatter_reduce(0, index, feats[in_idx], reduce=reduce, include_self=False)

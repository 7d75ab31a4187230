"""Kernel maps: which input row feeds which output row through which kernel offset.

Geometry (logical coordinates ``c = C / S`` at input stride ``S``; ``k`` a kernel position):
- submanifold: output support = input support, input ``c + (k - (ks - 1) // 2)·d``;
- strided conv / pool: output ``o`` with ``o·s = c + p − k·d`` (output stride ``S·s``);
- transposed conv: same relation read backwards onto the support the conv came from;
- generative transposed conv: creates ``o·s + k`` (output stride ``S / s``).

Every geometry has at most one input per (output, offset), so a map is one int32 table
``[M, K]`` (output row → input row per offset, the input row count as "absent"). The table is
what the convolutions gather with; the per-offset pair lists of the original design are
derived from it lazily, in their original order, for the code that wants them. Every step is
vectorized over rows; loops run over kernel offsets only.
"""

from __future__ import annotations

from functools import cached_property

import torch

from torchlower.errors import InvalidArgumentError
from torchlower.lattice import threads
from torchlower.lattice.sparse import CoordIndex, Hash, Triple, dense_limit, kernel_offsets, unique_keys

Pairs = tuple[tuple[int, torch.Tensor, torch.Tensor], ...]
LOOKUP_ROWS = 1 << 13  # rows of shifted keys per grid gather (≤ 0.9 MiB at K = 27)


class KernelMap:
    """Output coordinates + the neighbour table ``[M, K]`` (sentinel ``in_rows``).

    Built either from a table (the builders here) or, as before, from per-offset ``pairs``
    ``(k, in_idx, out_idx)``; each form is derived from the other on first use.
    ``pair_order`` says how pairs are sorted inside an offset: by output row (submanifold)
    or by input row (every other geometry) — the order the original builders produced.
    """

    def __init__(
        self,
        out_coords: torch.Tensor,
        out_stride: Triple,
        pairs: Pairs | None = None,
        *,
        table: torch.Tensor | None = None,
        in_rows: int | None = None,
        pair_order: str = "in",
    ) -> None:
        if pairs is None and table is None:
            raise InvalidArgumentError("KernelMap needs pairs or a table")
        self.out_coords = out_coords
        self.out_stride = out_stride
        self.pair_order = pair_order
        self._table = table
        self._in_rows = in_rows
        self.memo: dict[object, object] = {}  # compute plans derived from the table
        if pairs is not None:
            self.__dict__["pairs"] = pairs

    @property
    def rows(self) -> int:
        return int(self.out_coords.shape[0])

    def table_for(self, in_rows: int, volume: int) -> torch.Tensor:
        """The int32 ``[M, volume]`` table whose sentinel is ``in_rows`` (built once)."""
        if self._table is None or self._in_rows != in_rows or self._table.shape[1] != volume:
            table = torch.full((self.rows, volume), in_rows, dtype=torch.int32)
            for k, in_idx, out_idx in self.pairs:
                table[out_idx, k] = in_idx.to(torch.int32)
            self._table, self._in_rows = table, in_rows
        return self._table

    @cached_property
    def pairs(self) -> Pairs:
        """Per-offset ``(k, in_idx, out_idx)`` (int64), offsets in weight order, empty ones left out."""
        assert self._table is not None and self._in_rows is not None
        groups = []
        for k in range(self._table.shape[1]):
            col = self._table[:, k]
            out_idx = (col != self._in_rows).nonzero().squeeze(1)
            if len(out_idx) == 0:
                continue
            in_idx = col[out_idx].long()
            if self.pair_order == "in":
                in_idx, order = torch.sort(in_idx)
                out_idx = out_idx[order]
            groups.append((k, in_idx, out_idx))
        return tuple(groups)

    @cached_property
    def pair_count(self) -> int:
        if "pairs" in self.__dict__ or self._table is None:
            return sum(len(p[1]) for p in self.pairs)
        return int((self._table != self._in_rows).sum())

    def fill(self, volume: int) -> float:
        """Share of the ``M × volume`` table slots that hold a pair."""
        return self.pair_count / max(1, self.rows * volume)

    def flat(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.pairs:
            empty = torch.zeros(0, dtype=torch.long)
            return empty, empty
        return torch.cat([p[1] for p in self.pairs]), torch.cat([p[2] for p in self.pairs])


def _t(values: Triple) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


def _offset_keys(h: Hash, delta: torch.Tensor) -> torch.Tensor:
    """``key(c + δ) − key(c)`` per offset: the hash is linear inside its (widened) range."""
    zero = torch.zeros(len(delta), 4, dtype=torch.long)
    zero[:, 1:] = delta
    return h.encode(zero + h.lo) - h.encode(h.lo)


@threads.serialized
def subm_map(coords: torch.Tensor, stride: Triple, kernel: Triple, dilation: Triple) -> KernelMap:
    """Neighbour table ``[N, K]`` in one pass. With a dense grid: one gather of the ``N·K``
    shifted keys. With sorted keys: the centre column is the identity and only one of each
    pair ``±δ`` is searched, its partner filled by the inverse (``c + δ = c'`` ⇔ ``c' − δ = c``)."""
    offs = kernel_offsets(kernel)
    n, volume = int(coords.shape[0]), len(offs)
    delta = (offs - (_t(kernel) - 1) // 2) * _t(dilation) * _t(stride)  # [K, 3] physical
    margin = torch.cat([torch.zeros(1, dtype=torch.long), delta.abs().max(dim=0).values])
    index = CoordIndex(coords, Hash.covering([coords], margin))
    keys = index.row_keys
    shift = _offset_keys(index.hash, delta).to(keys.dtype)
    if index.grid is not None:  # chunks of rows: the shifted keys stay in cache
        table = torch.empty(n, volume, dtype=torch.int32)
        grid = index.grid

        def work(run: list[int]) -> None:
            query = torch.empty(min(n, LOOKUP_ROWS), volume, dtype=torch.int32)
            for start in run:
                end = min(n, start + LOOKUP_ROWS)
                q = query[: end - start]
                torch.add(keys[start:end].unsqueeze(1), shift.unsqueeze(0), out=q)
                torch.index_select(grid, 0, q.view(-1), out=table[start:end].view(-1))

        threads.run(work, threads.groups(range(0, n, LOOKUP_ROWS), threads.requested(), lambda _: 1))
        return KernelMap(coords, stride, table=table, in_rows=n, pair_order="out")
    position = {tuple(d): k for k, d in enumerate(delta.tolist())}
    searched, partners = [], []
    for k, d in enumerate(delta.tolist()):
        partner = position.get(tuple(-v for v in d))
        if partner is None or partner > k:  # search k; fill its partner (if any) by inversion
            searched.append(k)
            if partner is not None and partner != k:
                partners.append((k, partner))
    table = torch.full((n, volume), n, dtype=torch.int32)
    if (0, 0, 0) in position:
        table[:, position[(0, 0, 0)]] = torch.arange(n, dtype=torch.int32)  # the centre: identity
    found = index.rows_of_keys(keys.unsqueeze(1) + shift[searched].unsqueeze(0))  # [N, S]
    table[:, searched] = found
    column = {k: j for j, k in enumerate(searched)}
    rows = torch.arange(n, dtype=torch.int32)
    flat = table.view(-1)
    for k, partner in partners:
        hit = found[:, column[k]]
        ok = hit != n
        flat[hit[ok].long() * volume + partner] = rows[ok]
    return KernelMap(coords, stride, table=table, in_rows=n, pair_order="out")


def _out_table(
    out_idx: torch.Tensor, k_idx: torch.Tensor, in_idx: torch.Tensor, rows: int, volume: int, n: int
) -> torch.Tensor:
    """``[rows, volume]`` int32 table with ``table[out, k] = in`` and ``n`` elsewhere."""
    table = torch.full((rows * volume,), n, dtype=torch.int32)
    table[out_idx * volume + k_idx] = in_idx.to(torch.int32)
    return table.view(rows, volume)


def _floordiv(v: torch.Tensor, s: int) -> torch.Tensor:
    """``v // s`` for ``s ≥ 1``; a shift for powers of two (int64 division is ~50 ns an element)."""
    if s == 1:
        return v
    if s & (s - 1) == 0:
        return v >> (s.bit_length() - 1)
    return torch.div(v, s, rounding_mode="floor")


def _divisible(v: torch.Tensor, s: int) -> torch.Tensor:
    if s & (s - 1) == 0:
        return (v & (s - 1)) == 0
    return v % s == 0


@threads.serialized
def conv_map(
    coords: torch.Tensor,
    stride: Triple,
    kernel: Triple,
    conv_stride: Triple,
    padding: Triple,
    dilation: Triple,
) -> KernelMap:
    """Strided conv / pool: every (input, offset) with ``(c + p − k·d) % s == 0`` makes an output.

    Per axis everything is a ``[k_a, N]`` tensor (divisibility, output coordinate); the output
    key of every (offset, input) is composed from them by broadcasting over the kernel axes,
    so no ``[P, 4]`` candidate table is formed, encoded or scattered: the distinct keys are
    the outputs (in lexicographic order), decoded once per output."""
    n = int(coords.shape[0])
    volume = kernel[0] * kernel[1] * kernel[2]
    out_stride = tuple(a * b for a, b in zip(stride, conv_stride, strict=True))
    if n == 0:
        return _empty(out_stride, volume)  # type: ignore[arg-type]
    batch = coords[:, 0].long()
    lo, radix = [int(batch.min())], [int(batch.max()) - int(batch.min()) + 1]
    if all(k <= s and d == 1 for k, s, d in zip(kernel, conv_stride, dilation, strict=True)):
        k_idx, in_idx, key = _single_offset(coords, batch, stride, kernel, conv_stride, padding, lo, radix)
    else:
        key = (batch - lo[0]).unsqueeze(0)  # [1, N], grows one kernel axis per coordinate axis
        ok = torch.ones(1, n, dtype=torch.bool)
        for a in range(3):
            c = _floordiv(coords[:, a + 1].long(), stride[a])
            v = c.unsqueeze(0) + padding[a] - (torch.arange(kernel[a]) * dilation[a]).unsqueeze(1)  # [k_a, N]
            o = _floordiv(v, conv_stride[a])
            _extend(lo, radix, o)
            key = (key.unsqueeze(-2) * radix[-1] + (o - lo[-1])).flatten(0, -2)  # [K_so_far · k_a, N]
            ok = (ok.unsqueeze(-2) & _divisible(v, conv_stride[a])).flatten(0, -2)
        k_idx, in_idx = ok.nonzero(as_tuple=True)
        key = key[k_idx, in_idx]
    return _outputs(key, k_idx, in_idx, lo, radix, out_stride, volume, n)


def _extend(lo: list[int], radix: list[int], o: torch.Tensor) -> None:
    low, high = int(o.min()), int(o.max())
    lo.append(low)
    radix.append(high - low + 1)


def _single_offset(
    coords: torch.Tensor,
    batch: torch.Tensor,
    stride: Triple,
    kernel: Triple,
    conv_stride: Triple,
    padding: Triple,
    lo: list[int],
    radix: list[int],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Kernel ≤ stride, no dilation (downsampling k2 s2, pools): an input meets at most one
    offset per axis, ``k = (c + p) mod s`` when that is below the kernel size, so the pairs
    come from one ``[N]`` mask instead of a ``[K, N]`` one (the order of the pairs does not
    matter: the table and the sorted output keys are the same in any order)."""
    key, k_flat, ok = batch - lo[0], torch.zeros_like(batch), torch.ones_like(batch, dtype=torch.bool)
    for a in range(3):
        v = _floordiv(coords[:, a + 1].long(), stride[a]) + padding[a]
        r = v - _floordiv(v, conv_stride[a]) * conv_stride[a]  # the offset hitting an output
        o = _floordiv(v, conv_stride[a])
        _extend(lo, radix, o)
        key = key * radix[-1] + (o - lo[-1])
        k_flat = k_flat * kernel[a] + r
        ok &= r < kernel[a]
    in_idx = ok.nonzero().squeeze(1)
    return k_flat[in_idx], in_idx, key[in_idx]


def _outputs(
    key: torch.Tensor,
    k_idx: torch.Tensor,
    in_idx: torch.Tensor,
    lo: list[int],
    radix: list[int],
    out_stride: Triple,
    volume: int,
    n: int,
) -> KernelMap:
    """Distinct output keys (lexicographic = sorted) decoded to coordinates, and the table."""
    h = Hash(torch.tensor(lo), torch.tensor(radix))
    if float(h.radix.double().prod()) >= 2**62:
        raise InvalidArgumentError(f"coordinate range of {radix} cells is too large to hash")
    keys, out_idx = unique_keys(key, int(h.radix.prod()))
    out_coords = h.decode(keys)
    out_coords[:, 1:] *= torch.tensor(out_stride, dtype=torch.int32)
    table = _out_table(out_idx, k_idx, in_idx, len(out_coords), volume, n)
    return KernelMap(out_coords, out_stride, table=table, in_rows=n)


@threads.serialized
def transpose_map(
    coords: torch.Tensor,
    stride: Triple,
    target: torch.Tensor,
    kernel: Triple,
    conv_stride: Triple,
    padding: Triple,
    dilation: Triple,
    *,
    conv: KernelMap | None = None,
) -> KernelMap:
    """Inverse of ``conv_map``: input row o feeds target row c when ``o·s = c + p − k·d``.

    ``conv`` — the map of the conv from ``target`` with this geometry whose outputs are
    ``coords`` — is simply inverted (no lookup); otherwise each (o, k) is looked up in ``target``.
    """
    out_stride = tuple(a // b for a, b in zip(stride, conv_stride, strict=True))
    volume = kernel[0] * kernel[1] * kernel[2]
    n, m = int(coords.shape[0]), int(target.shape[0])
    if conv is not None:
        forward = conv.table_for(m, volume)  # [n, K]: conv output o ← target row c
        o_idx, k_idx = (forward != m).nonzero(as_tuple=True)
        c_idx = forward[o_idx, k_idx].long()
    else:
        offs = kernel_offsets(kernel)
        logical = torch.stack([_floordiv(coords[:, a + 1].long(), stride[a]) for a in range(3)], 1)
        c = logical.unsqueeze(0) * _t(conv_stride) - _t(padding) + (offs * _t(dilation)).unsqueeze(1)
        batch = coords[:, :1].long().unsqueeze(0).expand(volume, -1, -1)
        query = torch.cat([batch, c * _t(out_stride)], dim=-1)  # type: ignore[arg-type]
        found = CoordIndex(target).lookup(query)  # [K, n]
        k_idx, o_idx = (found >= 0).nonzero(as_tuple=True)
        c_idx = found[k_idx, o_idx]
    table = _out_table(c_idx, k_idx, o_idx, m, volume, n)
    return KernelMap(target, out_stride, table=table, in_rows=n)  # type: ignore[arg-type]


@threads.serialized
def generative_map(coords: torch.Tensor, stride: Triple, kernel: Triple, conv_stride: Triple) -> KernelMap:
    """Generative transposed conv: input o creates ``o·s + k`` at stride ``S / s``."""
    if any(a % b for a, b in zip(stride, conv_stride, strict=True)):
        raise InvalidArgumentError(
            f"generative transposed conv stride {conv_stride} does not divide {stride}"
        )
    out_stride = tuple(a // b for a, b in zip(stride, conv_stride, strict=True))
    n, volume = int(coords.shape[0]), kernel[0] * kernel[1] * kernel[2]
    if n == 0:
        return _empty(out_stride, volume)  # type: ignore[arg-type]
    batch = coords[:, 0].long()
    lo, radix = [int(batch.min())], [int(batch.max()) - int(batch.min()) + 1]
    key = (batch - lo[0]).unsqueeze(0)  # [1, N], one kernel axis more per coordinate axis
    for a in range(3):
        base = _floordiv(coords[:, a + 1].long(), stride[a]) * conv_stride[a]
        o = base.unsqueeze(0) + torch.arange(kernel[a]).unsqueeze(1)  # [k_a, N]
        _extend(lo, radix, o)
        key = (key.unsqueeze(-2) * radix[-1] + (o - lo[-1])).flatten(0, -2)
    k_idx = torch.arange(volume).repeat_interleave(n)
    in_idx = torch.arange(n).repeat(volume)
    return _outputs(key.view(-1), k_idx, in_idx, lo, radix, out_stride, volume, n)  # type: ignore[arg-type]


def _empty(out_stride: Triple, volume: int) -> KernelMap:
    table = torch.zeros(0, volume, dtype=torch.int32)
    return KernelMap(torch.zeros(0, 4, dtype=torch.int32), out_stride, table=table, in_rows=0)


__all__ = ["KernelMap", "conv_map", "dense_limit", "generative_map", "subm_map", "transpose_map"]

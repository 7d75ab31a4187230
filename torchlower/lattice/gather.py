"""Row chunks, padded feature copies and per-output bags: the gather building blocks the
convolution (``kernels.py``) and pool (``pools.py``) kernels share. Each is built once per map
(kept in ``KernelMap.memo``) or reused across calls, never rebuilt per chunk.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from torchlower.lattice.maps import KernelMap

IM2COL_FLOATS = 3 << 17  # im2col: gathered floats per chunk (1.5 MiB: chunk + weights stay in a 2 MiB L2)
# a GEMM of few rows may take another kernel: single-threaded MKL rounded a row alike for any
# M ≥ 16 rows (N ≥ 3 columns) on the machine this was written on — measured, not guaranteed
MIN_CHUNK_ROWS = 64


def chunks(rows: int, per_row: int, chunk: int | None) -> list[tuple[int, int]]:
    """Row ranges of about ``IM2COL_FLOATS / per_row`` rows, the remainder merged into the last
    range so no range is shorter than ``MIN_CHUNK_ROWS`` unless it is the whole output."""
    size = chunk if chunk is not None else max(MIN_CHUNK_ROWS, IM2COL_FLOATS // max(1, per_row))
    bounds = [*range(0, rows, size), rows]
    if chunk is None and len(bounds) > 2 and bounds[-1] - bounds[-2] < MIN_CHUNK_ROWS:
        del bounds[-2]
    return list(itertools.pairwise(bounds))


@contextlib.contextmanager
def padded(kmap: KernelMap, feats: torch.Tensor, fill: float, grad: bool) -> Iterator[torch.Tensor]:
    """``feats`` and one more row of ``fill``, which the table's sentinel ``n`` reads — a copy
    per call, cheaper than blanking the absent slots after the gather (``index_fill_``: ~60 ns
    a row; ``torch.cat`` is ~8× slower than ``copy_``). The buffer is kept on the map and
    reused: a fresh one costs its page faults every call (8 ms of a 16 ms strided conv)."""
    if grad:
        yield F.pad(feats, (0, 0, 0, 1), value=fill)
        return
    free = kmap.memo.setdefault(("padded", feats.dtype, tuple(feats.shape)), [])
    assert isinstance(free, list)
    try:
        padded = free.pop()  # atomic: concurrent calls on one map never share a buffer
    except IndexError:
        padded = feats.new_empty(feats.shape[0] + 1, feats.shape[1])
    padded[:-1].copy_(feats)
    padded[-1].fill_(fill)
    try:
        yield padded
    finally:
        free.append(padded)


def bags(kmap: KernelMap, in_rows: int, volume: int) -> tuple[torch.Tensor, ...]:
    """Pairs grouped by output, offsets ascending inside each group (built once per map):
    input rows, offsets, the first pair of every output and every output's pair count."""
    key = ("bags", in_rows, volume)
    if key not in kmap.memo:
        table = kmap.table_for(in_rows, volume)
        out_idx, k_idx = (table != in_rows).nonzero(as_tuple=True)
        sizes = torch.bincount(out_idx, minlength=kmap.rows)
        starts = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)[:-1]])
        kmap.memo[key] = (table[out_idx, k_idx].long(), k_idx, starts, sizes)
    return kmap.memo[key]  # type: ignore[return-value]


__all__ = ["IM2COL_FLOATS", "MIN_CHUNK_ROWS", "bags", "chunks", "padded"]

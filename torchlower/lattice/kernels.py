"""The compute of sparse convolutions and pools over a kernel map (``maps.py`` builds them).

Convolution, three ways; the original rounding first (``choose``): an output that sums several
pairs can get the original engine's float32 rounding only from im2col (the same rows times the
same ``[K·I, O]`` weight, in chunks), so im2col runs down to ``EXACT_FILL``:
- **im2col** (sums at fill ≥ ``EXACT_FILL``; the fastest from ``IM2COL_FILL`` anyway): a few
  hundred output rows at a time (``IM2COL_FLOATS``: the chunk stays in L2), their ``K``
  neighbours' features gathered with ``index_select`` into one reused buffer (absent = the
  zero row appended to a copy of the features) — or, when there are few slots per input
  (strided convs), by one ``embedding_bag`` over a per-map plan (one bag per slot, empty when
  absent) that needs no copy — then one ``mm`` with the ``[K·I, O]`` weight into the output
  slice. The gathered rows are the original engine's bit for bit (data movement) and the
  product is the same; its rounding is the original's where the BLAS rounds a row alike
  whatever the number of rows in the product (single-threaded MKL did for ≥ 16 rows on the
  machine this was written on; a Zen 4's did not: issue 26); only the ``1 − fill`` padding is
  wasted;
- **inputs** (input fill ≥ ``INPUTS_FILL``: generative and kernel = stride transposed convs,
  where nearly every input feeds every offset): one GEMM ``[N, I] @ [I, K·O]`` gives every
  input × offset product, and each output sums its pairs' rows with ``embedding_bag`` (one
  pair per output for kernel ≤ stride: a plain gather of the products);
- **pairs** (LiDAR-like maps below ``EXACT_FILL``, or at most one pair per output): blocks of
  outputs; per block, one gather of its pairs' inputs, one ``mm`` per offset, and the products
  summed back per output by ``embedding_bag`` (``index_add_`` costs ~80 ns a row on CPU).
Buffers are one chunk (im2col) or one block (pairs), never ``M·K·C``; only ``inputs`` holds
``N·K·O`` products, and it is chosen only when at least half of them are used.
Pools are ``pools.py``; the row chunks, padded copies and bags both use are ``gather.py``.
Without autograd every op writes into reused buffers (``out=``); with it, the same steps run
as recorded ops so training works. Without autograd, chunks run in parallel over Python threads
with every GEMM single-threaded (``threads.py``).

What is guaranteed: without autograd, on one machine (CPU, torch and BLAS build), the outputs
are bit for bit the same at any thread count and on every call — the chunks depend only on the
map and the channel counts and each one's GEMM has the same shapes, operands and alignment
whichever thread runs it. Between methods, chunk sizes, CPUs or BLAS builds, and against the
original engine, every output is the same sum of ``K·I`` products and the bias, evaluated in
another order or blocking: equal within float32 rounding, ``|Δ| ≤ 2·γ(K·I + 1)·Σ|x·w|``
(``γ(n) = n·u / (1 − n·u)``, ``u = 2⁻²⁴``), not bit for bit. With autograd the ops run at torch's
thread count: float32 rounding across thread counts too.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from torchlower.errors import InvalidArgumentError
from torchlower.lattice import gather, threads
from torchlower.lattice.maps import KernelMap, conv_map, generative_map, subm_map, transpose_map
from torchlower.lattice.pools import apply_pool

IM2COL_FILL = 0.55  # measured: im2col 8 % faster at 0.65, equal at 0.60, pairs 20 % faster at 0.47
EXACT_FILL = 0.25  # im2col (the original product) for sums down to this fill: ≤ 4× padded work
BAGS_SLOTS = 4  # im2col gathers by bags when slots ≤ this × inputs (k2 s2: 1.6; subm k3: 20)
CHUNK_FLOATS = 1 << 20  # pairs / inputs: gathered floats or products per block
INPUTS_FILL = 0.5  # products used / computed for the inputs method
INPUTS_CHUNK_ROWS = 1024  # output rows per inputs chunk at least
INPUTS_FLOATS = 1 << 18  # inputs: products per chunk (1 MiB stays in L2; 4 MiB was 1.4× slower)


METHODS = ("auto", "im2col", "pairs", "inputs")


def choose(kmap: KernelMap, in_rows: int, volume: int) -> str:
    """The original product first: an output summing several pairs can get the original
    engine's rounding only from im2col (the others add per-offset products in another order),
    so im2col is used down to ``EXACT_FILL`` — below it (LiDAR-like sparsity, ≥ 4× padding) the
    per-offset methods. Outputs with at most one pair (transposed and generative convs with
    kernel ≤ stride) add nothing across offsets, so any method does: ``inputs`` when most
    *input* slots are used (every input feeds nearly every offset), else pairs. Every method is
    within float32 rounding of every other (the module docstring); which one matches the
    original bit for bit depends on the BLAS."""
    fill = kmap.fill(volume)
    if fill >= IM2COL_FILL:
        return "im2col"
    single = _single_source(kmap, in_rows, volume)
    if not single and fill >= EXACT_FILL:
        return "im2col"
    if kmap.pair_count >= INPUTS_FILL * in_rows * volume:
        return "inputs"
    return "pairs"


def _single_source(kmap: KernelMap, in_rows: int, volume: int) -> bool:
    """Whether no output has two pairs (built once per map)."""
    key = ("single-source", in_rows, volume)
    if key not in kmap.memo:
        table = kmap.table_for(in_rows, volume)
        kmap.memo[key] = kmap.rows == 0 or int((table != in_rows).sum(1).max()) <= 1
    return bool(kmap.memo[key])


def apply_conv(
    feats: torch.Tensor,
    kmap: KernelMap,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    chunk: int | None = None,
    method: str = "auto",
) -> torch.Tensor:
    """``weight [O, kx, ky, kz, I]``; ``method``: ``"auto"`` (by fill), ``"im2col"``, ``"pairs"``
    or ``"inputs"``. ``chunk`` fixes the im2col rows per chunk (default: sized to the cache)."""
    if method not in METHODS:
        raise InvalidArgumentError(f"conv method must be one of {METHODS}, got {method!r}")
    out_ch, in_ch = weight.shape[0], weight.shape[-1]
    volume = weight[0, ..., 0].numel()
    if method == "auto":
        method = choose(kmap, feats.shape[0], volume)
    grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (feats, weight, bias))
    if feats.shape[0] == 0 or kmap.rows == 0:
        out = feats.new_zeros(kmap.rows, out_ch)
    elif method == "inputs":
        out = _inputs(feats, kmap, weight, grad)
    elif method == "im2col":
        out = _im2col(feats, kmap, weight.reshape(out_ch, -1).t(), volume, chunk, grad)
    else:
        out = _pairs(feats, kmap, weight.reshape(out_ch, volume, in_ch), out_ch, grad)
    if bias is not None:
        out = out + bias if grad else out.add_(bias)
    return out


def _im2col(
    feats: torch.Tensor, kmap: KernelMap, w: torch.Tensor, volume: int, chunk: int | None, grad: bool
) -> torch.Tensor:
    """``grad``: the same chunks through autograd-recorded ops (no ``out=`` buffers)."""
    n, in_ch = feats.shape
    ranges = gather.chunks(kmap.rows, volume * in_ch, chunk)
    table = kmap.table_for(n, volume)
    if grad:
        with gather.padded(kmap, feats, 0.0, grad) as padded:  # row n: the absent neighbour
            parts = [padded.index_select(0, table[s:e].reshape(-1)).view(e - s, -1) @ w for s, e in ranges]
        return torch.cat(parts) if parts else feats.new_zeros(0, w.shape[1])
    out = feats.new_empty(kmap.rows, w.shape[1])
    if kmap.rows * volume <= BAGS_SLOTS * n:  # the padded copy would be a large share: bags
        plan = _im2col_plan(kmap, n, volume, ranges)

        def bagged(run: list[tuple[int, int, torch.Tensor, torch.Tensor]]) -> None:
            for start, end, inputs, bags in run:
                cols = F.embedding_bag(inputs, feats, bags, mode="sum")  # [rows·K, I], absent = 0
                torch.mm(cols.view(end - start, volume * in_ch), w, out=out[start:end])

        with threads.serial() as count:
            threads.run(bagged, threads.groups(plan, count, lambda c: c[1] - c[0]))
        return out

    def work(run: list[tuple[int, int]]) -> None:
        buf = feats.new_empty(max(e - s for s, e in run) * volume, in_ch)  # one chunk, reused
        for start, end in run:
            cols = buf[: (end - start) * volume]
            torch.index_select(padded, 0, table[start:end].view(-1), out=cols)
            torch.mm(cols.view(end - start, volume * in_ch), w, out=out[start:end])

    with threads.serial() as count, gather.padded(kmap, feats, 0.0, grad) as padded:
        threads.run(work, threads.groups(ranges, count, lambda r: r[1] - r[0]))
    return out


def _im2col_plan(
    kmap: KernelMap, in_rows: int, volume: int, ranges: list[tuple[int, int]]
) -> list[tuple[int, int, torch.Tensor, torch.Tensor]]:
    """Per chunk ``(start, end, inputs, bags)``: the present slots' input rows and one bag per
    slot (empty when absent), int32, built once per map. The gather is then one
    ``embedding_bag``: an empty bag sums to an exact +0 row, a one-entry bag is its row bit
    for bit, so the chunk is the original zero-padded gather without copying the features
    into a padded buffer every call (0.9 ms of a 5 ms strided conv at 100k voxels: the bags
    made the 100k Conv3d k2 s2 14 % faster at load 2). Used only where that copy matters
    (``BAGS_SLOTS``): with 20 slots an input (SubmConv3d k3) the copy is 3 % of the gather,
    the bags were no faster (2.49 vs 2.37 × floor) and the plan costs ~200 B a voxel."""
    key = ("im2col-plan", in_rows, volume, ranges[0] if ranges else None, len(ranges))
    if key in kmap.memo:
        return kmap.memo[key]  # type: ignore[return-value]
    flat = kmap.table_for(in_rows, volume).view(-1)
    present = flat != in_rows
    inputs = flat[present]
    first = present.cumsum(0, dtype=torch.int32)  # pairs up to and including each slot
    first -= present.to(torch.int32)  # ... before it: the slot's bag start
    ends = [*first[[s * volume for s, _ in ranges]].tolist(), len(inputs)]
    plan = []
    for i, (start, end) in enumerate(ranges):
        bags = first[start * volume : end * volume] - ends[i]
        plan.append((start, end, inputs[ends[i] : ends[i + 1]], bags))
    kmap.memo[key] = plan
    return plan


@dataclass(frozen=True)
class _Block:
    """Output rows ``[start, end)`` of a pairs plan: their pairs' input rows in (offset, output)
    order, each offset's slice of them, and for every output its pairs' positions (a bag)."""

    start: int
    end: int
    inputs: torch.Tensor  # int64 [P_b]
    slices: tuple[tuple[int, int, int], ...]  # (k, first, last) into inputs
    bag: torch.Tensor  # int64 [P_b] positions, grouped by output, offsets ascending inside
    bag_offsets: torch.Tensor  # int64 [end - start]


def _plan(kmap: KernelMap, in_rows: int, volume: int, budget: int) -> tuple[_Block, ...]:
    """Blocks of output rows holding about ``budget`` pairs each (built once per map)."""
    key = ("pairs-plan", in_rows, volume, budget)
    if key in kmap.memo:
        return kmap.memo[key]
    by_k = kmap.table_for(in_rows, volume).t()
    k_all, out_all = (by_k != in_rows).nonzero(as_tuple=True)  # offset-major, outputs ascending
    in_all = by_k[k_all, out_all].long()
    rows, pairs = kmap.rows, len(k_all)
    per_block = max(1, budget * rows // max(1, pairs))
    order = torch.argsort(out_all // per_block, stable=True)  # (block, offset, output)
    k_all, out_all, in_all = k_all[order], out_all[order], in_all[order]
    block_of = out_all // per_block
    counts = torch.bincount(block_of, minlength=(rows + per_block - 1) // per_block).tolist()
    blocks, first = [], 0
    for b, count in enumerate(counts):
        start, end = b * per_block, min(rows, (b + 1) * per_block)
        k_b, out_b = k_all[first : first + count], out_all[first : first + count] - start
        ends = [0, *torch.bincount(k_b, minlength=volume).cumsum(0).tolist()]
        slices = tuple((k, ends[k], ends[k + 1]) for k in range(volume) if ends[k + 1] > ends[k])
        bag = torch.argsort(out_b, stable=True)
        sizes = torch.bincount(out_b, minlength=end - start)
        offsets = torch.cat([sizes.new_zeros(1), sizes.cumsum(0)[:-1]])
        blocks.append(_Block(start, end, in_all[first : first + count], slices, bag, offsets))
        first += count
    kmap.memo[key] = plan = tuple(blocks)
    return plan


def _pairs(feats: torch.Tensor, kmap: KernelMap, w: torch.Tensor, out_ch: int, grad: bool) -> torch.Tensor:
    """Per-offset GEMMs over the pairs only; outputs are summed back by a bag gather
    (``embedding_bag``), not scattered — ``index_add_`` costs ~80 ns a row on CPU."""
    n, in_ch = feats.shape
    volume = w.shape[1]
    if grad:
        out = feats.new_zeros(kmap.rows, out_ch)
        for k, in_idx, out_idx in kmap.pairs:
            out = out.index_add(0, out_idx, feats.index_select(0, in_idx) @ w[:, k].t())
        return out
    plan = _plan(kmap, n, volume, max(8192, CHUNK_FLOATS // max(in_ch, out_ch)))
    w_k = w.permute(1, 2, 0).contiguous()  # [K, I, O]
    out = feats.new_empty(kmap.rows, out_ch)

    def work(run: list[_Block]) -> None:
        longest = max(len(b.inputs) for b in run)
        gathered, product = feats.new_empty(longest, in_ch), feats.new_empty(longest, out_ch)
        for block in run:
            count = len(block.inputs)
            g, y = gathered[:count], product[:count]
            torch.index_select(feats, 0, block.inputs, out=g)
            for k, first, last in block.slices:
                torch.mm(g[first:last], w_k[k], out=y[first:last])
            out[block.start : block.end] = F.embedding_bag(block.bag, y, block.bag_offsets, mode="sum")

    with threads.serial() as count:
        threads.run(work, threads.groups(plan, count, lambda b: len(b.inputs)))
    return out


def _inputs(feats: torch.Tensor, kmap: KernelMap, weight: torch.Tensor, grad: bool) -> torch.Tensor:
    """Every input times every offset's weight (``[n, I] @ [I, K·O]``), then each output sums
    its pairs' products (``embedding_bag``): no gather of inputs, no scatter. Without autograd
    it runs over chunks of outputs, each computing the products of the input rows it reads
    (sorted coordinates keep them in a narrow band) into one reused buffer."""
    out_ch, in_ch = weight.shape[0], weight.shape[-1]
    n, volume = feats.shape[0], weight[0, ..., 0].numel()
    w = weight.reshape(out_ch, volume, in_ch).permute(2, 1, 0).reshape(in_ch, volume * out_ch)
    inputs, k_idx, starts, _ = gather.bags(kmap, n, volume)
    if grad:
        products = (feats @ w).view(-1, out_ch)  # row n·K + k: input n through offset k
        return F.embedding_bag(inputs * volume + k_idx, products, starts, mode="sum")
    plan = _inputs_plan(kmap, n, volume, out_ch)
    out = feats.new_empty(kmap.rows, out_ch)

    def work(run: list[tuple]) -> None:
        buf = feats.new_empty(max(hi - lo for _, _, lo, hi, _, _ in run) * volume + 1, out_ch)
        for start, end, lo, hi, index, offsets in run:
            products = buf[: (hi - lo) * volume + 1]
            torch.mm(feats[lo:hi], w, out=products[:-1].view(hi - lo, volume * out_ch))
            if offsets is None:  # at most one pair per output: a plain gather (the last row is zero)
                products[-1].zero_()
                torch.index_select(products, 0, index, out=out[start:end])
            else:
                out[start:end] = F.embedding_bag(index, products, offsets, mode="sum")

    with threads.serial() as count:
        threads.run(work, threads.groups(plan, count, lambda c: c[3] - c[2]))
    return out


def _inputs_plan(kmap: KernelMap, in_rows: int, volume: int, out_ch: int) -> list[tuple]:
    """Output chunks ``(start, end, lo, hi, index, offsets)``: the chunk reads input rows
    ``[lo, hi)``; ``index`` addresses its products, ``offsets`` starts each output's bag —
    None when no output has two pairs (kernel ≤ stride), then ``index`` has one entry per
    output and an output without pairs reads the zero row after the products."""
    key = ("inputs-plan", in_rows, volume, out_ch)
    if key in kmap.memo:
        return kmap.memo[key]  # type: ignore[return-value]
    inputs, k_idx, starts, sizes = gather.bags(kmap, in_rows, volume)
    ends = torch.cat([starts, starts.new_tensor([len(inputs)])]).tolist()
    plan = []
    budget = INPUTS_FLOATS // (volume * out_ch)
    for start, end in _input_disjoint_chunks(inputs, sizes, kmap.rows, in_rows, budget):
        first, last = ends[start], ends[end]
        rows = inputs[first:last]
        lo, hi = (int(rows.min()), int(rows.max()) + 1) if len(rows) else (0, 0)
        index = (rows - lo) * volume + k_idx[first:last]
        plan.append((start, end, lo, hi, index, starts[start:end] - first))
    if sum(hi - lo for _, _, lo, hi, _, _ in plan) > 2 * in_rows:  # not local: one pass, no re-work
        plan = [(0, kmap.rows, 0, in_rows, inputs * volume + k_idx, starts)]
    if int(sizes.max()) <= 1:
        plan = [
            (s, e, lo, hi, _single(index, sizes[s:e], (hi - lo) * volume), None)
            for s, e, lo, hi, index, off in plan
        ]
    kmap.memo[key] = plan
    return plan


def _input_disjoint_chunks(
    inputs: torch.Tensor, sizes: torch.Tensor, rows: int, in_rows: int, budget: int
) -> list[tuple[int, int]]:
    """Output ranges whose input ranges do not overlap where the map allows it, each reading
    about ``budget`` input rows: a chunk computes the products of every input row in its
    range, so an input row shared by two chunks is multiplied twice (13 % of the products of
    the 100k ConvTranspose3d and generative convs with fixed ranges of outputs). A split before
    output ``s`` is clean when every input of the outputs before it is below every input of
    the outputs from it on; where no clean split is near, a fixed range of outputs (as many as
    ``budget`` inputs feed on average) ends the chunk instead."""
    owner = torch.repeat_interleave(torch.arange(rows), sizes)
    high = torch.full((rows,), -1, dtype=inputs.dtype).scatter_reduce(0, owner, inputs, "amax")
    low = torch.full((rows,), in_rows, dtype=inputs.dtype).scatter_reduce(0, owner, inputs, "amin")
    before = high.cummax(0).values  # the highest input of outputs ≤ o
    after = low.flip(0).cummin(0).values.flip(0)  # the lowest input of outputs ≥ o
    clean = [*((before[:-1] < after[1:]).nonzero().squeeze(1) + 1).tolist(), rows]
    reach = before[torch.tensor(clean, dtype=torch.long) - 1].tolist()
    step = max(INPUTS_CHUNK_ROWS, budget * rows // max(1, in_rows))
    bounds, start = [], 0
    while start < rows:
        j = bisect.bisect_left(reach, int(after[start]) + budget) - 1  # last clean split in budget
        if j >= 0 and clean[j] > start:
            end = clean[j]
        else:
            end = min(clean[bisect.bisect_right(clean, start)], start + step)
        bounds.append((start, end))
        start = end
    merged: list[tuple[int, int]] = []  # a GEMM of few rows may round differently: merge short ones
    for start, end in bounds:
        if (
            merged
            and min(_span(high, low, *merged[-1]), _span(high, low, start, end)) < gather.MIN_CHUNK_ROWS
        ):
            merged[-1] = (merged[-1][0], end)
        else:
            merged.append((start, end))
    return merged


def _span(high: torch.Tensor, low: torch.Tensor, start: int, end: int) -> int:
    """The input rows outputs ``[start, end)`` read (their range; 0 when they have no pairs)."""
    return max(0, int(high[start:end].max()) - int(low[start:end].min()) + 1)


def _single(index: torch.Tensor, sizes: torch.Tensor, zero: int) -> torch.Tensor:
    """One product row per output (``zero`` for outputs without a pair)."""
    rows = torch.full((len(sizes),), zero, dtype=torch.long)
    rows[sizes == 1] = index
    return rows


__all__ = [
    "KernelMap",
    "apply_conv",
    "apply_pool",
    "conv_map",
    "generative_map",
    "subm_map",
    "transpose_map",
]

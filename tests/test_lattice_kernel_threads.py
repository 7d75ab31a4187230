"""The sparse engine's promise about threads (issue 26): the same kernel on the same shapes gives
the same bits at any thread count, because the chunking depends only on the map and the channel
counts and every GEMM runs single-threaded (``torchlower/lattice/threads.py``); and the chunked
paths (gathers, transposed inputs, max-pool slots) agree with the oracle within float32
rounding. Split from ``test_lattice_kernels.py``, whose helpers these tests share.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
from collections.abc import Callable, Iterator

import pytest
import torch

from tests import lattice_kernels_oracle as O
from tests.test_lattice_kernels import CLOUDS, cloud, network, within_rounding
from torchlower import lattice as L
from torchlower.lattice import gather, kernels, pools, threads


@pytest.mark.parametrize("name,span", [("dense", 6), ("sparse", 10), ("far", 8)])
def test_thread_count_independence(name: str, span: int) -> None:
    """1 and 2 threads give bit-identical outputs on clouds big enough for several chunks and
    blocks (span 6: ~85 % occupied, im2col; span 10: ~30 %, pairs; far: sorted-keys maps).
    Exact by construction on any CPU: the chunks and blocks depend only on the map and the
    channel counts, every GEMM runs single-threaded (``test_gemms_do_not_depend_on_the_thread_count``
    checks both), so each output row comes from the same GEMM at either thread count."""
    spec = dict(CLOUDS[name], n=6000, span=span, channels=16)
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            x = cloud(**spec)  # type: ignore[arg-type]
            runs.append(network(x))
    finally:
        torch.set_num_threads(before)
    for one, two in zip(*runs, strict=True):
        assert torch.equal(one.coords, two.coords)
        assert torch.equal(one.feats, two.feats)


def every_module(x: L.SparseTensor) -> list[torch.Tensor]:
    """Every sparse module once, wide enough (``K·I = 864`` in, 64 out) that a multi-threaded
    MKL GEMM would round differently from a single-threaded one."""
    torch.manual_seed(2)
    c = x.num_channels
    stem = L.SubmConv3d(c, 64, 3, bias=True)
    a = stem(x)
    b = L.Conv3d(64, 16, 2, 2)(a)
    up = L.ConvTranspose3d(16, 64, 2, 2)(b)
    outs = [
        a,
        b,
        up,
        L.GenerativeConvTranspose3d(16, 64, 3, 2)(b),
        L.NormalizedSubmConv3d(16, 64, 3, eps=1e-3)(b),
        L.NormalizedConvTranspose3d(16, 64, 2, 2)(b),
        L.NormalizedGenerativeConvTranspose3d(16, 64, 2, 2)(b),
        L.Conv3d(64, 64, 3, 2, 1)(a, b),  # onto a given target support
        L.MaxPool3d(3, 2, 1)(a),
        L.AvgPool3d(2, 2)(a),
        L.SumPool3d(2, 2)(a),
        L.PoolTranspose3d(2, 2)(b, x),
        L.TrilinearUpsample3d(2)(b, x),
    ]
    feats = [o.feats for o in outs] + [L.GlobalAvgPool()(a), L.GlobalMaxPool()(a)]
    return feats + [o.coords for o in outs]


@pytest.mark.parametrize("n,span", [(3000, 5), (900, 3)])  # many chunks and blocks; a tiny layer
def test_every_module_thread_count_independent(n: int, span: int) -> None:
    x = cloud(n=n, span=span, channels=32, seed=3)
    before = torch.get_num_threads()
    runs = []
    try:
        for count in (1, 2, 1):
            torch.set_num_threads(count)
            with torch.no_grad():
                runs.append(every_module(x))
            assert torch.get_num_threads() == count  # the kernels restore the caller's setting
    finally:
        torch.set_num_threads(before)
    # exact: see test_thread_count_independence; the global pools (scatter_reduce) and the
    # trilinear upsample (index_add_) run at torch's thread count but sum each output row in one
    # thread, in index order, whatever that count
    for one, two, again in zip(*runs, strict=True):
        assert torch.equal(one, two) and torch.equal(one, again)


def test_strided_bags_gather_in_chunks() -> None:
    """The strided convs' bag gather (no padded copy) split into many 64-row chunks: each chunk
    is the zero-padded gather bit for bit (data movement: an empty bag sums to +0, a one-entry
    bag is its row), the outputs are the oracle's to float32 rounding (other GEMM shapes) and
    bit for bit the same at 1 and 2 threads (the same chunks, single-threaded GEMMs)."""
    x = cloud(n=3000, span=5, channels=32, seed=3)
    geo = ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    kmap = kernels.conv_map(x.coords, x.stride, *geo)
    assert kmap.rows * 8 <= kernels.BAGS_SLOTS * len(x.coords) and kmap.rows % 64 >= 16
    n = len(x.coords)
    ranges = gather.chunks(kmap.rows, 8 * 32, 64)
    padded = torch.cat([x.feats, x.feats.new_zeros(1, 32)])
    table = kmap.table_for(n, 8)
    for start, end, inputs, bags in kernels._im2col_plan(kmap, n, 8, ranges):
        cols = torch.nn.functional.embedding_bag(inputs, x.feats, bags, mode="sum")
        assert torch.equal(cols, padded[table[start:end].reshape(-1).long()])
    w = torch.randn(16, 2, 2, 2, 32)
    old = O.conv_map(x.coords, x.stride, *geo)
    want = O.apply_conv(x.feats, old, w, None)
    magnitude = O.apply_conv(x.feats.abs().double(), old, w.abs().double(), None)
    before = torch.get_num_threads()
    runs = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            with torch.no_grad():
                chunked = kernels.apply_conv(x.feats, kmap, w, None, chunk=64, method="im2col")
                runs.append((chunked, kernels.apply_conv(x.feats, kmap, w, None)))
    finally:
        torch.set_num_threads(before)
    for got in runs[0]:
        within_rounding(got, want, magnitude, 8 * 32)
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))


def test_transposed_inputs_in_disjoint_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The transposed and generative convs' products in many small chunks whose input ranges
    do not overlap (each input multiplied once; no chunk's GEMM below MIN_CHUNK_ROWS rows): the
    oracle's outputs to float32 rounding (one pair per output, but ``[rows, I] @ [I, K·O]``
    products against the oracle's ``[M, K·I]`` rows), bit for bit the same at 1 and 2 threads —
    from fresh worker threads, whose first op here is a GEMM (``threads.run`` sets their count)."""
    monkeypatch.setattr(kernels, "INPUTS_FLOATS", 100 * 8 * 16)  # ~100 input rows a chunk
    x = cloud(n=3000, span=5, channels=16, seed=3)
    c = x.coords.long() + 64  # rows in lexicographic order, as voxelize makes them: local chunks
    x = L.SparseTensor(
        x.feats, x.coords[(((c[:, 0] * 128 + c[:, 1]) * 128 + c[:, 2]) * 128 + c[:, 3]).argsort()]
    )
    geo = ((2, 2, 2), (2, 2, 2), (0, 0, 0), (1, 1, 1))
    down = kernels.conv_map(x.coords, x.stride, *geo)
    y = L.SparseTensor(torch.randn(down.rows, 16), down.out_coords, down.out_stride, check=False)
    w = torch.randn(16, 2, 2, 2, 16)
    maps = {
        "up": (
            kernels.transpose_map(y.coords, y.stride, x.coords, *geo, conv=down),
            O.transpose_map(y.coords, y.stride, x.coords, *geo),
        ),
        "gen": (
            kernels.generative_map(y.coords, y.stride, (2, 2, 2), (2, 2, 2)),
            O.generative_map(y.coords, y.stride, (2, 2, 2), (2, 2, 2)),
        ),
    }
    before = torch.get_num_threads()
    try:
        for kmap, old in maps.values():
            plan = kernels._inputs_plan(kmap, down.rows, 8, 16)
            assert len(plan) > 4 and sum(hi - lo for _, _, lo, hi, _, _ in plan) == down.rows
            assert min(hi - lo for _, _, lo, hi, _, _ in plan) >= gather.MIN_CHUNK_ROWS
            want = O.apply_conv(y.feats, old, w, None)
            magnitude = O.apply_conv(y.feats.abs().double(), old, w.abs().double(), None)
            runs = []
            for count in (1, 2):
                torch.set_num_threads(count)
                monkeypatch.setattr(threads, "_POOLS", {})  # fresh worker threads
                with gemm_log() as log, torch.no_grad():
                    runs.append(kernels.apply_conv(y.feats, kmap, w, None, method="inputs"))
                assert log and {call[-1] for call in log} <= {1, None}  # MKL single-threaded
            within_rounding(runs[0], want, magnitude, 8 * 16)
            assert torch.equal(runs[0], runs[1])
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("kernel,stride", [(2, 2), (3, 2)])
def test_max_pool_slot_major_chunks(monkeypatch: pytest.MonkeyPatch, kernel: int, stride: int) -> None:
    """The max pool's slot-major gather in many chunks (the last one short), with NaN and ±inf
    among the features: exactly the oracle's scatter-reduce (NaN where it has NaN), at 1 and 2
    threads — by construction: a max returns one of its operands, in any order."""
    monkeypatch.setattr(pools, "POOL_FLOATS", 37 * kernel**3 * 8)  # 37 output rows a chunk
    x = cloud(n=3000, span=5, channels=8, seed=5)
    feats = x.feats.clone()
    feats[::7, 1], feats[::11, 2], feats[::13, 3] = float("nan"), float("inf"), float("-inf")
    geo = ((kernel,) * 3, (stride,) * 3, (0, 0, 0), (1, 1, 1))
    new, old = kernels.conv_map(x.coords, x.stride, *geo), O.conv_map(x.coords, x.stride, *geo)
    assert new.rows > 4 * 37 and new.rows % 37 != 0
    want = O.apply_pool(feats, old, "max")
    before = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            with torch.no_grad():
                got = kernels.apply_pool(feats, new, "max")
                torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)  # NaN ≠ NaN
    finally:
        torch.set_num_threads(before)


def _mkl_threads() -> Callable[[], int] | None:
    """MKL's thread count for the calling thread (``mkl_get_max_threads``), None without MKL."""
    try:
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        get = lib.mkl_get_max_threads
    except (OSError, AttributeError):
        return None
    get.restype = ctypes.c_int
    return get


@contextlib.contextmanager
def gemm_log() -> Iterator[list[tuple]]:
    """Every ``torch.mm`` inside, from any thread: operand and output shapes, strides and
    addresses modulo 64 bytes (what a BLAS may choose its kernel by) and, last, MKL's thread
    count in the calling thread at the call (None without MKL)."""
    mkl, mm, log = _mkl_threads(), torch.mm, []

    def logged(a: torch.Tensor, b: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        where = tuple((t.shape, t.stride(), t.data_ptr() % 64) for t in (a, b, out) if t is not None)
        log.append((*where, mkl() if mkl is not None else None))  # list.append: thread-safe
        return mm(a, b, out=out) if out is not None else mm(a, b)

    torch.mm = logged  # type: ignore[assignment]
    try:
        yield log
    finally:
        torch.mm = mm  # type: ignore[assignment]


@pytest.mark.parametrize("n,span", [(3000, 5), (900, 3)])
def test_gemms_do_not_depend_on_the_thread_count(monkeypatch: pytest.MonkeyPatch, n: int, span: int) -> None:
    """What makes the outputs thread-count independent on any CPU, checked directly: at 1, 2 and
    3 threads every module runs the same GEMMs (shapes, strides, alignment: the chunking depends
    only on the map) and each runs with MKL single-threaded, in fresh worker threads too."""
    x = cloud(n=n, span=span, channels=32, seed=3)
    before = torch.get_num_threads()
    logs = []
    try:
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            monkeypatch.setattr(threads, "_POOLS", {})
            with gemm_log() as log, torch.no_grad():
                every_module(x)
            logs.append(collections.Counter(log))
    finally:
        torch.set_num_threads(before)
    assert sum(logs[0].values()) > 20
    assert all({call[-1] for call in log} <= {1, None} for log in logs)
    assert logs[0] == logs[1] == logs[2]

"""Parallelism that cannot change a single bit: serial GEMMs, parallel row chunks.

MKL's ``sgemm`` chooses how to split a product from the thread count, and some splits cut the
reduction: measured with torch 2.13's MKL on this project's machine, with 2 threads a product
with ``K ≥ 432`` and ``M ≤ 256`` rows, or ``N ≥ 64`` columns at any ``M``, rounds differently from
1 thread. A sparse conv whose GEMMs ran multi-threaded would therefore give different outputs at
different thread counts (spconv's CPU build is worse: wrong rows). Here every GEMM of a sparse
kernel runs single-threaded (``torch.set_num_threads(1)`` for the duration of the kernel, restored
after, and in every worker thread before its work: a fresh thread's MKL otherwise starts at the
machine's core count until torch first initializes it) and the parallelism is over independent
chunks of output rows instead, one Python thread per torch thread (torch ops release the GIL).

The guarantee, on one machine (one CPU, one torch / BLAS build): the chunk bounds depend only on
the map and the channel counts, never on the thread count, and each chunk's GEMM gets the same
shapes, operands and alignment whichever thread runs it, so the outputs are the 1-thread outputs
at any thread count — bit for bit, by construction. It says nothing across machines or shapes: a
product of other shapes (another chunking, the pre-rewrite engine, a dense conv), another CPU or
BLAS build agrees to float32 rounding only (``docs/lattice.md``, *Speed*).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")

_LOCK = threading.Lock()
_STATE = {"depth": 0, "threads": 1}  # nested / concurrent kernels: the first one in restores
_POOLS: dict[int, ThreadPoolExecutor] = {}


@contextlib.contextmanager
def serial() -> Iterator[int]:
    """Run torch single-threaded inside; yields the thread count the caller had asked for."""
    with _LOCK:
        if _STATE["depth"] == 0:
            _STATE["threads"] = torch.get_num_threads()
            if _STATE["threads"] > 1:
                torch.set_num_threads(1)
        _STATE["depth"] += 1
        threads = _STATE["threads"]
    try:
        yield threads
    finally:
        with _LOCK:
            _STATE["depth"] -= 1
            if _STATE["depth"] == 0 and _STATE["threads"] > 1:
                torch.set_num_threads(_STATE["threads"])


def requested() -> int:
    """The caller's thread count inside ``serial`` (where torch's own count reads 1)."""
    with _LOCK:
        return _STATE["threads"] if _STATE["depth"] else torch.get_num_threads()


def serialized(fn: Callable[P, R]) -> Callable[P, R]:
    """``fn`` inside ``serial``: kernel-map builders are many small ops, and OpenMP runs every
    one of them as a parallel region whose barrier waits for all threads — on a busy machine
    a preempted thread stalls each op (2-thread maps measured 10–50× slower than 1-thread at
    load 9 on 2 cores). One Python-thread split per map costs one such wait, not hundreds."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with serial():
            return fn(*args, **kwargs)

    return wrapper


def groups(items: Sequence[T], count: int, weight: Callable[[T], int]) -> list[list[T]]:
    """``items`` cut into at most ``count`` contiguous runs of about equal total ``weight``."""
    total = sum(weight(i) for i in items)
    runs: list[list[T]] = [[]]
    done = 0
    for item in items:
        if runs[-1] and len(runs) < count and done >= total * len(runs) / count:
            runs.append([])
        runs[-1].append(item)
        done += weight(item)
    return [r for r in runs if r]


def run(work: Callable[[list[T]], None], runs: list[list[T]]) -> None:
    """``work(run)`` for every run: the first in the calling thread, the others in a pool (inside
    ``serial``: every run is single-threaded)."""
    if len(runs) <= 1:
        for r in runs:
            work(r)
        return
    pool = _POOLS.get(len(runs) - 1)
    if pool is None:
        pool = _POOLS.setdefault(len(runs) - 1, ThreadPoolExecutor(len(runs) - 1, "lattice"))
    grad = torch.is_grad_enabled()  # thread-local: the workers take the caller's mode

    def job(r: list[T]) -> None:
        # a pool thread's OpenMP / MKL thread counts are its own: set them before any GEMM (a
        # fresh thread's first ``torch.mm`` would otherwise run on every core, rounded as such)
        torch.set_num_threads(1)
        with torch.set_grad_enabled(grad):
            work(r)

    futures = [pool.submit(job, r) for r in runs[1:]]
    try:
        work(runs[0])
    finally:  # never return while a worker still writes into the caller's buffers
        errors = [f.exception() for f in futures]
    for error in errors:
        if error is not None:
            raise error


__all__ = ["groups", "requested", "run", "serial", "serialized"]

"""Benchmark (not a test) of the sparse engine: map build and per-call time of SubmConv3d 32→32
k3, Conv3d 32→32 k2 s2, ConvTranspose3d 32→32 k2 s2 (inverting that conv), the generative
transposed conv 32→32 k2 s2 (creating every ``o·2 + k`` from the strided voxels) and MaxPool3d
k2 s2 on ~10k / 100k / 1M-voxel surface clouds, at 1 and 2 threads, median of 5, side by side with
the engine before issue 17 (``tests/lattice_kernels_oracle.py``, 1 thread, ≤ 100k) and
spconv's CPU build (1 thread — with 2 it returns wrong rows, spconv issue #679) when installed.
Every output is checked against a float64 dense reference (≤ 100k voxels).

"× floor" is the median over repeats of call time / floor time, the floor timed right before
each call: for a conv, ``mm``s of its useful FLOPs (2·pairs·I·O) in the dense op's own shape —
``[R, K·I] @ [K·I, O]`` for the convs, ``[R, I] @ [I, K·O]`` for the transposed ones — on a
block of ``R`` rows that stays in L2 (≤ 1 MiB), i.e. at the core's best GEMM rate; for the
pool, a dense ``amax`` over the same number of elements (a streaming, memory-bound floor).
At 2 threads the floor is the 1-thread floor halved (``paired_ms``). "× floor CPU" is the same
ratio in the calling thread's CPU time (1 thread): steadier than the wall-clock one on a shared
machine, since waiting for a core is not counted (cache misses caused by the other processes
still are). Run:
    PYTHONPATH=. OMP_NUM_THREADS=2 nice .venv/bin/python bench/lattice_subm_conv.py [--sizes 10k,100k]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from bench import lattice_reference as R
from torchlower import lattice as L
from torchlower.lattice import kernels

VOXEL = {"10k": 0.066, "100k": 0.03, "1M": 0.013}
ONE, TWO, NOPAD = (1, 1, 1), (2, 2, 2), (0, 0, 0)


def cloud(target: int = 100_000, voxel: float = 0.03) -> L.SparseTensor:
    """A random surface-like cloud: points on two noisy unit spheres (2 batches), voxelized."""
    g = torch.Generator().manual_seed(0)
    n = 4 * target
    pts = torch.randn(n, 3, generator=g)
    pts = pts / pts.norm(dim=1, keepdim=True) * (1 + 0.02 * torch.randn(n, 1, generator=g))
    batch = torch.randint(0, 2, (n,), generator=g, dtype=torch.int32)
    active = torch.tensor([n], dtype=torch.int32)
    return L.voxelize(pts, torch.randn(n, 32, generator=g), batch, active, voxel, -1.2)


def sample_ms(fn: Callable[[], object], min_seconds: float = 0.06) -> float:
    """Mean ms of ``fn`` over a loop of at least ``min_seconds`` (long enough that a shared
    machine's preemptions average out instead of landing on one short call)."""
    return sample_both(fn, min_seconds)[0]


def sample_both(fn: Callable[[], object], min_seconds: float = 0.06) -> tuple[float, float]:
    """Mean wall ms and mean CPU ms of the calling thread per call, over the same loop. The CPU
    time leaves out the time the thread waited for a core while other processes ran (on 2
    shared cores the wall time of one call swings 2× with the load); it is the whole cost of a
    1-thread call, since our kernels run on the calling thread at 1 thread."""
    count, t0, c0 = 0, time.perf_counter(), time.thread_time()
    while True:
        fn()
        count += 1
        elapsed = time.perf_counter() - t0
        if elapsed >= min_seconds:
            return elapsed / count * 1e3, (time.thread_time() - c0) / count * 1e3


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    fn()
    return statistics.median(sample_ms(fn) for _ in range(repeats))


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def memory_of(size: str) -> str:
    """One table row: peak resident memory our five modules' maps and calls add on top of the cloud
    (Linux: ``clear_refs`` 5 resets the peak, ``VmHWM`` reads it), and the time of building
    the maps + running the calls once, 1 thread. Run in a fresh process per size."""
    torch.set_num_threads(1)
    x = cloud(int(float(size.rstrip("kM")) * (1e3 if size.endswith("k") else 1e6)), VOXEL[size])
    Path("/proc/self/clear_refs").write_text("5")
    base = _status_kb("VmRSS")
    t0 = time.perf_counter()
    with torch.no_grad():
        s = L.SubmConv3d(32, 32, 3)(x)
        d = L.Conv3d(32, 32, 2, 2)(s)
        up, gen = L.ConvTranspose3d(32, 32, 2, 2)(d), L.GenerativeConvTranspose3d(32, 32, 2, 2)(d)
        kept = [s, d, up, gen, L.MaxPool3d(2, 2)(s)]
    ms = (time.perf_counter() - t0) * 1e3
    extra = (_status_kb("VmHWM") - base) / 1024
    n = len(x.coords)
    per = extra * 2**20 / n
    return f"| {n:,} | {ms:,.0f} | {ms * 1e6 / n:,.0f} | {extra:,.0f} | {per:,.0f} | {len(kept)} |"


def load() -> str:
    return "/".join(f"{v:.2f}" for v in os.getloadavg())


FLOOR_FLOATS = 1 << 18  # the floor's GEMM operand: 1 MiB, resident in the 2 MiB L2


def floor_fn(kmap: kernels.KernelMap, volume: int, kind: str) -> Callable[[], object]:
    """The op's floor as a dense op. ``conv``: ``mm``s of ``[R, K·32] @ [K·32, 32]`` totalling
    its useful FLOPs (2·pairs·32·32); ``transposed``: the same FLOPs as ``[R, 32] @ [32, K·32]``
    (a dense transposed conv's GEMM); both on an L2-resident block, its larger operand ≤ 1 MiB
    (the earlier 4096-row block was 4–14 MiB, out of L2, and ran 10–30 % below the core's GEMM
    rate: a floor too slow; the transposed floor's 8192-row block had an 8 MiB output, ~10 %
    slower than a 1024-row one).
    ``pool``: an ``amax`` over as many elements as the pool reads, laid out contiguously as
    ``[K, rows, C]`` and reduced over ``K`` — as fast as a plain streaming read of them; the
    earlier ``[rows, K, C]`` reduced over the middle dimension ran ~1.8× slower (measured at
    100k), a floor too slow."""
    if kind == "pool":  # reduced over the outer dimension: elementwise over contiguous rows
        t = torch.randn(max(1, kmap.pair_count // max(1, kmap.rows)), kmap.rows, 32)
        return lambda: torch.amax(t, 0)
    k_dim, n_dim = (volume * 32, 32) if kind == "conv" else (32, volume * 32)
    block = max(64, FLOOR_FLOATS // max(k_dim, n_dim))  # A and C both ≤ 1 MiB
    a, b, c = torch.randn(block, k_dim), torch.randn(k_dim, n_dim), torch.empty(block, n_dim)
    rows = kmap.pair_count * 32 * 32 // (k_dim * n_dim)  # rows·K_dim·N_dim = pairs·32·32
    full, rest = divmod(rows, block)

    def run() -> None:
        for _ in range(full):
            torch.mm(a, b, out=c)
        if rest:
            torch.mm(a[:rest], b, out=c[:rest])

    return run


KIND = {"subm": "conv", "down": "conv", "up": "transposed", "gen": "transposed", "pool": "pool"}


def single_threaded(fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            return fn()
        finally:
            torch.set_num_threads(before)

    return run


def paired_ms(
    fn: Callable[[], object], floor: Callable[[], object], repeats: int, share: int = 1
) -> tuple[float, float, float, float]:
    """Median call ms, median floor ms and the median of the per-repeat ratios (the floor runs
    right before each call, so both see the same machine load). ``share``: the floor's time is
    divided by it — at ``t`` threads the floor is the 1-thread floor over ``t`` (perfect
    scaling), not MKL's own ``t``-thread GEMM, whose OpenMP barriers wait for preempted
    threads on a loaded machine (3 s for a 47 ms floor at load 7) and made "× floor" < 1.
    The fourth value is the same median ratio in the calling thread's CPU time (meaningful at
    1 thread only: at 2 the other Python thread's time is not counted)."""
    fn(), floor()
    calls, floors = [], []
    for _ in range(repeats):
        floors.append(sample_both(floor))
        calls.append(sample_both(fn))
    ratio = statistics.median(c[0] / (f[0] / share) for c, f in zip(calls, floors, strict=True))
    cpu = statistics.median(c[1] / f[1] for c, f in zip(calls, floors, strict=True))
    return statistics.median(c[0] for c in calls), statistics.median(f[0] for f in floors) / share, ratio, cpu


class Case:
    """Our modules on one cloud, their maps, references and (optional) spconv twins."""

    def __init__(self, x: L.SparseTensor) -> None:
        torch.manual_seed(0)
        self.x = x
        self.subm = L.SubmConv3d(32, 32, 3).eval()
        self.down = L.Conv3d(32, 32, 2, 2).eval()
        self.up = L.ConvTranspose3d(32, 32, 2, 2).eval()
        self.pool = L.MaxPool3d(2, 2).eval()
        self.gen = L.GenerativeConvTranspose3d(32, 32, 2, 2).eval()
        with torch.no_grad():
            self.d = self.down(x)
        self.maps = {
            "subm": kernels.subm_map(x.coords, x.stride, (3, 3, 3), ONE),
            "down": kernels.conv_map(x.coords, x.stride, TWO, TWO, NOPAD, ONE),
        }
        self.maps["up"] = kernels.transpose_map(
            self.d.coords, self.d.stride, x.coords, TWO, TWO, NOPAD, ONE, conv=self.maps["down"]
        )
        self.maps["pool"] = self.maps["down"]
        self.maps["gen"] = kernels.generative_map(self.d.coords, self.d.stride, TWO, TWO)

    def builders(self) -> dict[str, Callable[[], object]]:
        x, d = self.x, self.d
        down = self.maps["down"]
        return {
            "subm": lambda: kernels.subm_map(x.coords, x.stride, (3, 3, 3), ONE),
            "down": lambda: kernels.conv_map(x.coords, x.stride, TWO, TWO, NOPAD, ONE),
            "up": lambda: kernels.transpose_map(
                d.coords, d.stride, x.coords, TWO, TWO, NOPAD, ONE, conv=down
            ),
            "pool": lambda: kernels.conv_map(x.coords, x.stride, TWO, TWO, NOPAD, ONE),
            "gen": lambda: kernels.generative_map(d.coords, d.stride, TWO, TWO),
        }

    def calls(self) -> dict[str, Callable[[], L.SparseTensor]]:
        return {
            "subm": lambda: self.subm(self.x),
            "down": lambda: self.down(self.x),
            "up": lambda: self.up(self.d),
            "pool": lambda: self.pool(self.x),
            "gen": lambda: self.gen(self.d),
        }

    def references(self) -> dict[str, torch.Tensor]:
        x, d = self.x, self.d
        return {
            "subm": R.ref_subm(x, self.subm.weight),
            "down": R.ref_down(x, self.down.weight, d),
            "up": R.ref_up(d, self.up.weight, x),
            "pool": R.ref_maxpool(x, 2, d),
            "gen": R.ref_up(d, self.gen.weight, self.generated),
        }

    @property
    def generated(self) -> L.SparseTensor:
        with torch.no_grad():
            return self.gen(self.d)


def old_engine(case: Case, repeats: int) -> dict[str, tuple[float, float]]:
    """(map ms, call ms) of the engine before issue 17 (the frozen copy in ``tests/``)."""
    from tests import lattice_kernels_oracle as O

    x, d = case.x, case.d
    w = {k: getattr(case, k).weight for k in ("subm", "down", "up", "gen")}
    builds = {
        "subm": lambda: O.subm_map(x.coords, x.stride, (3, 3, 3), ONE),
        "down": lambda: O.conv_map(x.coords, x.stride, TWO, TWO, NOPAD, ONE),
        "up": lambda: O.transpose_map(d.coords, d.stride, x.coords, TWO, TWO, NOPAD, ONE),
        "gen": lambda: O.generative_map(d.coords, d.stride, TWO, TWO),
    }
    maps = {k: b() for k, b in builds.items()}
    out = {}
    for k in ("subm", "down", "up", "gen"):
        feats = (d if k in ("up", "gen") else x).feats
        out[k] = (
            median_ms(builds[k], repeats),
            median_ms(lambda k=k, f=feats: O.apply_conv(f, maps[k], w[k], None), repeats),
        )
    out["pool"] = (out["down"][0], median_ms(lambda: O.apply_pool(x.feats, maps["down"], "max"), repeats))
    return out


def spconv_engine(case: Case, repeats: int, refs: dict[str, torch.Tensor] | None) -> dict[str, tuple]:
    """(map ms, call ms, max err) of spconv's CPU build on the same voxels and weights."""
    w = {k: getattr(case, k).weight.detach() for k in ("subm", "down", "up", "gen")}
    ops = R.spconv_ops(case.x, w)
    if ops is None:
        return {}
    subm, down, up, pool, gen, tensor, grid = (
        ops[k] for k in ("subm", "down", "up", "pool", "gen", "tensor", "grid")
    )
    base = tensor()  # type: ignore[operator]
    with torch.no_grad():
        d = down(base)  # type: ignore[operator]
        results = {"subm": subm(base), "down": d, "up": up(d), "pool": pool(base), "gen": gen(d)}  # type: ignore[operator]
        # spconv keeps index pairs in the *output's* indice_dict: reuse them for the cached calls
        warm = tensor()  # type: ignore[operator]
        warm.indice_dict = dict(results["subm"].indice_dict)  # type: ignore[attr-defined]

        def fresh(k: str) -> Callable[[], object]:
            def run() -> object:
                t = tensor()  # type: ignore[operator]
                if k == "up":
                    return up(down(t))  # type: ignore[operator]
                return {"subm": subm, "down": down, "pool": pool}[k](t)  # type: ignore[operator]

            return run

        cached = {
            "subm": lambda: subm(warm),  # type: ignore[operator]
            "down": lambda: down(tensor()),  # type: ignore[operator]  # spconv reuses subm indices only
            "up": lambda: up(d),  # type: ignore[operator]
            "pool": lambda: pool(tensor()),  # type: ignore[operator]  # builds its map every call
            "gen": lambda: gen(d),  # type: ignore[operator]  # builds its map every call
        }
        out: dict[str, tuple] = {}
        for k in ("subm", "down", "up", "pool", "gen"):
            call = median_ms(cached[k], repeats)
            total = call if k in ("down", "pool", "gen") else median_ms(fresh(k), repeats)
            if k == "up":  # the fresh run also built + ran the down conv
                total -= median_ms(fresh("down"), repeats)
            err = None
            if refs is not None:
                stride = 1 if k in ("subm", "up", "gen") else 2
                coords, feats = R.spconv_rows(results[k], stride, grid)  # type: ignore[arg-type]
                targets = {"subm": case.x.coords, "up": case.x.coords, "gen": case.generated.coords}
                target = targets.get(k, case.d.coords)
                aligned = R.align_rows(coords, feats, target)
                want = refs[k].clamp(min=0) if k == "pool" else refs[k]  # spconv's max starts from 0
                err = float("inf") if aligned is None else R.max_err(aligned, want)
            out[k] = (None if k in ("down", "pool", "gen") else max(0.0, total - call), call, err, cached[k])
    return out


def spconv_cell(s: tuple | None) -> str:
    if not s:
        return "–"
    return f"{s[0]:.1f} / {s[1]:.1f}" if s[0] is not None else f"(in call) / {s[1]:.1f}"


NAMES = {
    "subm": "SubmConv3d k3",
    "down": "Conv3d k2 s2",
    "up": "ConvTranspose3d k2 s2",
    "pool": "MaxPool3d k2 s2",
    "gen": "Generative ConvT3d k2 s2",
}


def run(sizes: list[str], threads: list[int], repeats: int, spconv: bool, before: bool) -> list[str]:
    lines = [
        "| voxels | op | thr | rows in→out | pairs (fill) | map ms | call ms | floor ms | × floor "
        "| × floor CPU | before map / call | spconv map / call | call vs spconv | max err ours / spconv "
        "| load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for size in sizes:
        x = cloud(int(float(size.rstrip("kM")) * (1e3 if size.endswith("k") else 1e6)), VOXEL[size])
        case = Case(x)
        refs = case.references() if len(x.coords) <= 200_000 else None
        torch.set_num_threads(1)
        old = old_engine(case, max(1, repeats // 2)) if before and len(x.coords) <= 200_000 else {}
        theirs = spconv_engine(case, repeats, refs) if spconv else {}
        for thr in threads:
            torch.set_num_threads(thr)
            with torch.no_grad():
                for k, call in case.calls().items():
                    kmap = case.maps[k]
                    volume = 8 if k != "subm" else 27
                    map_ms = median_ms(case.builders()[k], repeats)
                    floor_1 = single_threaded(floor_fn(kmap, volume, KIND[k]))
                    call_ms, floor, ratio, cpu = paired_ms(call, floor_1, repeats, share=thr)
                    err = "" if refs is None else f"{R.max_err(call().feats, refs[k]):.1e}"
                    o = old.get(k) if thr == 1 else None
                    s = theirs.get(k) if thr == 1 else None
                    vs = paired_ms(call, s[3], repeats)[2] if s else None  # ours / spconv, paired
                    n_in = len(case.d.coords) if k in ("up", "gen") else len(x.coords)
                    lines.append(
                        f"| {len(x.coords):,} | {NAMES[k]} | {thr} | {n_in:,}→{kmap.rows:,} "
                        f"| {kmap.pair_count:,} ({kmap.fill(volume):.0%}) | {map_ms:.1f} | {call_ms:.1f} "
                        f"| {floor:.1f} | {ratio:.2f} | {f'{cpu:.2f}' if thr == 1 else '–'} "
                        f"| {f'{o[0]:.0f} / {o[1]:.0f}' if o else '–'} "
                        f"| {spconv_cell(s)} "
                        f"| {f'{vs:.2f}×' if vs else '–'} "
                        f"| {err or '–'} / {(f'{s[2]:.1e}' if s[2] is not None else '–') if s else '–'} "
                        f"| {load()} |"
                    )
                    print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10k,100k,1M")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-spconv", action="store_true")
    parser.add_argument("--no-before", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="also write the table here")
    parser.add_argument("--memory", action="store_true", help="only the time + peak memory table")
    parser.add_argument("--memory-of", default=None, help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.memory_of:
        print(memory_of(a.memory_of))
        return
    if a.memory:
        print(f"load average {load()}; first run of 5 modules (maps built + calls), 1 thread")
        print("| voxels | maps + calls ms | ns per voxel | peak extra MB | bytes per voxel | modules |")
        print("|---|---|---|---|---|---|")
        for size in a.sizes.split(","):
            cmd = [sys.executable, __file__, "--memory-of", size]
            row = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip()
            print(row.splitlines()[-1], flush=True)
        print(f"load average at the end: {load()}")
        return
    print(
        f"torch {torch.__version__}, load average {load()} (1/5/15 min), {os.cpu_count()} cores", flush=True
    )
    lines = run(
        a.sizes.split(","),
        [int(t) for t in a.threads.split(",")],
        a.repeats,
        not a.no_spconv,
        not a.no_before,
    )
    print(f"load average at the end: {load()}")
    if a.out:
        a.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

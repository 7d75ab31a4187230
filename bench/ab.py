"""Side-by-side tract timing of two NNEF exports of the same zoo model, and where the time goes.

    python -m bench.ab MODEL [MODEL ...] [--exporters tl-jit,t2n] [--rounds 15] [--profile]

Both archives are loaded in this one process and timed interleaved (round after round, each
round a burst of runs of every artifact in turn, rotating who goes first), so a loaded machine
slows both alike; the ratio of medians is what is printed, with ``uptime``'s load average.
``--profile`` adds tract's per-node profile (``profile_json``) summed by op, which is how a
fused or missing kernel shows up; ``--plan`` prints the optimized nodes themselves.
Single-threaded: run it under ``RAYON_NUM_THREADS=1 TRACT_FLASH_SDPA_ST=1`` (set here too).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

for _k, _v in (("RAYON_NUM_THREADS", "1"), ("TRACT_FLASH_SDPA_ST", "1"), ("OMP_NUM_THREADS", "1")):
    os.environ.setdefault(_k, _v)

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.exporters import exporter  # noqa: E402
from bench.worker import _flat, max_error  # noqa: E402
from bench.zoo import ZOO  # noqa: E402


def load_tract(path: Path) -> tuple[Any, float]:
    import tract

    nnef = tract.nnef().with_tract_extra().with_tract_transformers()
    t0 = time.perf_counter()
    runnable = nnef.load(str(path)).into_runnable()
    return runnable, time.perf_counter() - t0


def interleaved(
    runners: dict[str, Any], inputs: list[np.ndarray], rounds: int, burst: int
) -> dict[str, float]:
    """Median seconds per run of each runner, measured in alternating bursts."""
    times: dict[str, list[float]] = {k: [] for k in runners}
    names = list(runners)
    for r in runners.values():
        for _ in range(3):
            r.run(inputs)
    for i in range(rounds):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            run = runners[name].run
            for _ in range(burst):
                t0 = time.perf_counter()
                run(inputs)
                times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def by_op(runnable: Any, inputs: list[np.ndarray], repeats: int = 5) -> dict[str, float]:
    """Seconds per op name (tract's optimized op), median over ``repeats`` profiles."""
    samples: dict[str, list[float]] = defaultdict(list)
    for _ in range(repeats):
        prof = json.loads(runnable.profile_json(inputs))
        acc: dict[str, float] = defaultdict(float)
        for node in prof.get("nodes", []):
            acc[node.get("op_name", node.get("op", "?"))] += float(node.get("secs_per_iter", 0.0))
        for k, v in acc.items():
            samples[k].append(v)
    return {k: statistics.median(v) for k, v in samples.items()}


def plan(runnable: Any, inputs: list[np.ndarray]) -> list[tuple[str, str, float]]:
    prof = json.loads(runnable.profile_json(inputs))
    return [
        (n.get("node_name", "?"), n.get("op_name", "?"), float(n.get("secs_per_iter", 0.0)))
        for n in prof["nodes"]
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+")
    p.add_argument("--exporters", type=lambda s: s.split(","), default=["tl-jit", "t2n"])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--burst", type=int, default=20)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--plan", action="store_true")
    p.add_argument("--keep", type=Path, default=None, help="keep the archives in this folder")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    root = Path(a.keep or tempfile.mkdtemp(prefix="torchlower-ab-"))
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    for name in a.models:
        if name not in ZOO:
            raise SystemExit(f"unknown model {name!r}; the zoo has {sorted(ZOO)}")
        model, args = ZOO[name].build()
        with torch.no_grad():
            want = _flat(model(*args))
        inputs = [t.numpy() for t in args]
        runners, loads, errors = {}, {}, {}
        for ex in a.exporters:
            folder = root / name / ex
            folder.mkdir(parents=True, exist_ok=True)
            try:
                path = exporter(ex).export(model, args, folder)[0]
                runners[ex], loads[ex] = load_tract(path)
                errors[ex] = max_error(want, [t.to_numpy() for t in runners[ex].run(inputs)])
            except Exception as exc:  # a failing exporter is reported, not fatal
                print(f"{name:22s} {ex}: failed: {type(exc).__name__}: {str(exc)[:200]}")
        if len(runners) < 2:
            continue
        med = interleaved(runners, inputs, a.rounds, a.burst)
        first, second = a.exporters[0], a.exporters[1]
        cells = "  ".join(
            f"{ex} {med[ex] * 1e6:8.1f} µs (load {loads[ex] * 1e3:5.1f} ms, err {errors[ex]:.1e})"
            for ex in runners
        )
        load = os.getloadavg()[0]
        print(f"{name:22s} {cells}  ratio {med[first] / med[second]:.3f}  load {load:.2f}", flush=True)
        if a.profile:
            ops = {ex: by_op(r, inputs) for ex, r in runners.items()}
            keys = sorted(set().union(*ops.values()), key=lambda k: -max(o.get(k, 0) for o in ops.values()))
            for k in keys:
                row = "  ".join(f"{ops[ex].get(k, 0) * 1e6:8.1f}" for ex in runners)
                print(f"    {k[:40]:40s} {row}")
            print(
                "    "
                + "total".ljust(40)
                + " "
                + "  ".join(f"{sum(o.values()) * 1e6:8.1f}" for o in ops.values())
            )
        if a.plan:
            for ex, r in runners.items():
                print(f"  --- {ex}")
                for node, op, secs in plan(r, inputs):
                    print(f"    {secs * 1e6:8.1f}  {op:30s} {node}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

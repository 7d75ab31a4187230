"""The time a perfect graph would take in tract: the irreducible kernels of a model, each measured alone.

    python -m bench.kernel_floor MODEL [MODEL ...] [--rounds 10] [--repeats 7] [--out FILE]

For a zoo model this (1) exports torchlower's and torch_to_nnef's artifacts, times them
interleaved (wall clock, medians) and profiles both in tract (``profile_json``, per op);
(2) records, from one PyTorch run of the model, the computations every graph of it must do:

- each weight matmul (``F.linear``, and ``F.conv1d/2d`` as the conv it is) at its shape;
- each attention (``F.scaled_dot_product_attention``, or the eager ``matmul → softmax → matmul``
  with the additive bias between them as a constant mask) at its shape;
- each norm (``F.layer_norm``; a module named ``*LayerNorm`` / ``*RMSNorm`` that is not
  ``nn.LayerNorm`` as an RMS norm), each GELU (``F.gelu``, exact or tanh), each embedding lookup
  (``F.embedding``), each group norm (``F.group_norm``);

and (3) measures every distinct kernel standalone in tract — a one-op torch module exported by
torchlower, loaded, profiled single-threaded, the per-node times summed (Source and Const
excluded), median of ``--repeats`` profiles. Attention is measured both as tract's flash SDPA
(``tract_transformers_sdpa``) and as the decomposed ``matmul → softmax → matmul`` chain, and the
faster one counts. The floor is the sum over the model's kernels.

Composite functions are not looked into (``nn.MultiheadAttention``'s
``F.multi_head_attention_forward``, the encoder-layer fast path): such a model records no
kernels, which the report shows. What the floor leaves out is work a graph can avoid or tract
fuses for free: residual and bias adds (tract folds them into ``OptMatMul``), ReLU (fused
likewise), reshapes, the head split / merge transposes, scaling constants, position tables
(constants at a static shape).

Profiles inflate absolute times (a timer per node), so ``floor / t2n`` is computed on profile
totals of the same kind; the wall-clock ratio ours / t2n is printed beside it. If
``floor / t2n`` is above the goal (0.85 for the transformer families), no graph can meet the
goal in this tract; the per-op columns (ours, t2n, floor) name where our graph spends time
outside the floor.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

for _k, _v in (("RAYON_NUM_THREADS", "1"), ("TRACT_FLASH_SDPA_ST", "1"), ("OMP_NUM_THREADS", "1")):
    os.environ.setdefault(_k, _v)

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from bench.ab import load_tract  # noqa: E402
from bench.exporters import exporter  # noqa: E402
from bench.kernel_record import Kernel, Recorder, decomposed, record, standalone  # noqa: E402
from bench.worker import _flat, max_error  # noqa: E402
from bench.zoo import ZOO  # noqa: E402

_FREE = ("Source", "Const")  # no work at run time


def _profile(runnable: Any, inputs: list[np.ndarray]) -> dict[str, float]:
    """One tract profile: seconds per op name (no-work ops dropped)."""
    acc: dict[str, float] = defaultdict(float)
    for node in json.loads(runnable.profile_json(inputs)).get("nodes", []):
        if node.get("op_name") not in _FREE:
            acc[node.get("op_name", "?")] += float(node.get("secs_per_iter", 0.0))
    return acc


def profile_interleaved(
    runs: dict[Any, tuple[Any, list[np.ndarray]]], repeats: int
) -> dict[Any, dict[str, float]]:
    """Per-op medians over ``repeats`` profiles of every runnable, taken in turn (rotating who
    goes first), so a load burst on the shared machine hits the model and its kernels alike."""
    samples: dict[Any, list[dict[str, float]]] = {key: [] for key in runs}
    order = list(runs)
    for i in range(repeats):
        for key in order[i % len(order) :] + order[: i % len(order)]:
            runnable, inputs = runs[key]
            samples[key].append(_profile(runnable, inputs))
    out = {}
    for key, profiles in samples.items():
        ops = set().union(*profiles)
        out[key] = {op: statistics.median(p.get(op, 0.0) for p in profiles) for op in ops}
    return out


class _Null(nn.Module):
    """The same inputs, one trivial op: what a tract call costs with no kernel in it."""

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return xs[0] * 2  # the other inputs stay graph inputs: tract still receives them


def null_run(args: tuple[torch.Tensor, ...], folder: Path) -> tuple[Any, list[np.ndarray]]:
    folder.mkdir(parents=True, exist_ok=True)
    path = exporter("tl-jit").export(_Null().eval(), args, folder)[0]
    return load_tract(path)[0], [a.numpy() for a in args]


def forms(k: Kernel, rec: Recorder, folder: Path) -> dict[str, tuple[Any, list[np.ndarray]]]:
    """The kernel's standalone forms in tract, loaded: {form: (runnable, inputs)}, and under
    ``"null"`` the trivial graph on the same inputs (the per-call cost to subtract)."""
    model, args = standalone(k, rec)
    model.eval()
    ways = {"torchlower": contextlib.nullcontext}
    if k.kind == "sdpa":
        ways = {"flash": contextlib.nullcontext, "decomposed": decomposed}
    out = {}
    for form, ctx in ways.items():
        sub = folder / form
        sub.mkdir(parents=True, exist_ok=True)
        with ctx():
            path = exporter("tl-jit").export(model, args, sub)[0]
        out[form] = (load_tract(path)[0], [a.numpy() for a in args])
    out["null"] = null_run(args, folder / "null")
    return out


def _walls(runs: dict[Any, tuple[Any, list[np.ndarray]]], rounds: int) -> dict[Any, float]:
    """Median wall seconds per run of every runnable, interleaved (bursts of 20, rotating)."""
    times: dict[Any, list[float]] = {key: [] for key in runs}
    order = list(runs)
    for i in range(rounds):
        for key in order[i % len(order) :] + order[: i % len(order)]:
            runnable, inputs = runs[key]
            for _ in range(20):
                t0 = time.perf_counter()
                runnable.run(inputs)
                times[key].append(time.perf_counter() - t0)
    return {key: statistics.median(v) for key, v in times.items()}


# ---- (1) + report -------------------------------------------------------------------------------
def floor_of(name: str, rounds: int, repeats: int, root: Path) -> dict[str, Any]:
    model, args = ZOO[name].build()
    model.eval()
    with torch.no_grad():
        want = _flat(model(*args))
    inputs = [t.numpy() for t in args]
    runners, errors = {}, {}
    for ex in ("tl-jit", "t2n"):
        folder = root / name / ex
        folder.mkdir(parents=True)
        path = exporter(ex).export(copy.deepcopy(model), args, folder)[0]
        runners[ex], _ = load_tract(path)
        errors[ex] = max_error(want, [t.to_numpy() for t in runners[ex].run(inputs)])
    rec = record(copy.deepcopy(model), args)
    counts = Counter(rec.kernels)
    runs: dict[Any, tuple[Any, list[np.ndarray]]] = {ex: (r, inputs) for ex, r in runners.items()}
    for i, k in enumerate(counts):
        for form, run in forms(k, rec, root / name / "kernels" / str(i)).items():
            runs[(k, form)] = run
    runs["null"] = null_run(args, root / name / "null")
    medians = profile_interleaved({k: v for k, v in runs.items() if "null" not in k}, repeats)
    walls = _walls(runs, rounds)
    wall = {ex: walls[ex] for ex in runners}
    prof = {ex: medians[ex] for ex in runners}
    kernels: dict[Kernel, tuple[str, float, dict[str, float]]] = {}
    for k in counts:
        best = min((w, key[1]) for key, w in walls.items() if isinstance(key, tuple) and key[0] == k
                   and key[1] != "null")  # fmt: skip
        kernels[k] = (best[1], max(0.0, best[0] - walls[(k, "null")]), medians[(k, best[1])])
    kinds = {op for key, ops in medians.items() if isinstance(key, tuple) for op in ops}
    return {"model": name, "wall": wall, "null": walls["null"], "prof": prof, "errors": errors,
            "counts": counts, "kernels": kernels, "kinds": kinds, "load": os.getloadavg()[0]}  # fmt: skip


def _in_wall(ops: dict[str, float], seconds: float) -> dict[str, float]:
    """A profile's per-op times scaled to ``seconds``: profiles inflate small ops and a load burst
    during tract's ~5 s profiling window inflates them all, so only the shares are used."""
    total = sum(ops.values())
    return {op: v * seconds / total for op, v in ops.items()} if total else {}


def summary(r: dict[str, Any]) -> dict[str, Any]:
    """Wall-clock seconds: ours, t2n, the floor, ours per op, t2n per op, the floor per op, and
    ours outside the floor.

    The floor is one call's overhead (a trivial graph on the model's inputs) plus, for every
    kernel, its standalone wall time minus a trivial graph's on the kernel's inputs, times how
    often the model runs it. Per op, each profile is scaled to its artifact's wall time. Ours
    outside the floor is our time in op kinds that no form of a floor kernel uses (MoveAxis,
    IntoShape, ...);
    the *in-situ* floor is the rest of ours: the necessary kernels as they run inside our graph.
    """
    floor_ops: dict[str, float] = defaultdict(float)
    for k, n in r["counts"].items():
        _, seconds, ops = r["kernels"][k]
        for op, v in _in_wall(ops, seconds).items():
            floor_ops[op] += n * v
    ours = _in_wall(r["prof"]["tl-jit"], r["wall"]["tl-jit"])
    ref = _in_wall(r["prof"]["t2n"], r["wall"]["t2n"])
    outside = sum(v for op, v in ours.items() if op not in r["kinds"])  # no form of a kernel uses it
    floor = r["null"] + sum(floor_ops.values())
    return {"ours": r["wall"]["tl-jit"], "t2n": r["wall"]["t2n"], "floor": floor,
            "ours_ops": ours, "t2n_ops": ref, "floor_ops": dict(floor_ops), "outside": outside,
            "in_situ": r["wall"]["tl-jit"] - outside}  # fmt: skip


def report(r: dict[str, Any]) -> str:
    us = 1e6
    t = summary(r)
    out = [
        f"#### {r['model']} (load average {r['load']:.2f})",
        "",
        f"Wall clock, interleaved: ours {t['ours'] * us:.1f} µs, t2n {t['t2n'] * us:.1f} µs (ours / t2n"
        f" {t['ours'] / t['t2n']:.3f}; max err ours {r['errors']['tl-jit']:.1e}, t2n"
        f" {r['errors']['t2n']:.1e});"
        f" **floor {t['floor'] * us:.1f} µs, floor / t2n {t['floor'] / t['t2n']:.3f}**; in-situ floor"
        f" {t['in_situ'] * us:.1f} µs ({t['in_situ'] / t['t2n']:.3f} of t2n); ours outside the floor"
        f" {t['outside'] * us:.1f} µs ({t['outside'] / t['t2n']:.3f} of t2n).",
        "",
        "| op (µs, profile shares scaled to wall time) | ours | t2n | floor | ours − floor |",
        "|---|---|---|---|---|",
    ]
    ours, ref, fl = t["ours_ops"], t["t2n_ops"], t["floor_ops"]
    for op in sorted(set(ours) | set(ref) | set(fl), key=lambda o: -max(ours.get(o, 0), ref.get(o, 0))):
        a, b, f = ours.get(op, 0.0), ref.get(op, 0.0), fl.get(op, 0.0)
        mark = "" if op in r["kinds"] else " (outside the floor)"
        out.append(f"| {op}{mark} | {a * us:.1f} | {b * us:.1f} | {f * us:.1f} | {(a - f) * us:+.1f} |")
    out.append(f"| call overhead (trivial graph) | | | {r['null'] * us:.1f} | |")
    out.append(f"| total | {t['ours'] * us:.1f} | {t['t2n'] * us:.1f} | {t['floor'] * us:.1f} |"
               f" {(t['ours'] - t['floor']) * us:+.1f} |")  # fmt: skip
    out += ["", "| floor kernel | count | best form | µs each (minus a trivial graph) | µs total |",
            "|---|---|---|---|---|"]  # fmt: skip
    for k, n in r["counts"].items():
        form, seconds, _ = r["kernels"][k]
        out.append(f"| {k.label()} | {n} | {form} | {seconds * us:.1f} | {n * seconds * us:.1f} |")
    if not r["counts"]:
        out.append(
            "| (no kernel recorded: the model calls a composite this script does not look into) | | | | |"
        )
    return "\n".join(out) + "\n"


def overview(results: list[dict[str, Any]]) -> str:
    """One line per model: the ratios that decide whether a family goal is reachable."""
    out = [
        "| model | ours / t2n | floor / t2n | in-situ floor / t2n | ours outside the floor / t2n"
        " | load avg |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        t = summary(r)
        out.append(
            f"| {r['model']} | {t['ours'] / t['t2n']:.3f} | {t['floor'] / t['t2n']:.3f} |"
            f" {t['in_situ'] / t['t2n']:.3f} | {t['outside'] / t['t2n']:.3f} | {r['load']:.2f} |"
        )
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("models", nargs="+")
    p.add_argument("--rounds", type=int, default=10, help="interleaved wall-clock rounds (bursts of 20)")
    p.add_argument("--repeats", type=int, default=2, help="profiles of each (median; ~5 s each)")
    p.add_argument("--out", type=Path, default=None, help="append the tables to this markdown file")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="torchlower-floor-"))
    start = os.getloadavg()
    texts = [f"kernel floor (bench/kernel_floor.py), load average {start[0]:.2f} at start\n"]
    results = []
    for name in a.models:
        if name not in ZOO:
            raise SystemExit(f"unknown model {name!r}; the zoo has {sorted(ZOO)}")
        results.append(floor_of(name, a.rounds, a.repeats, root))
        text = report(results[-1])
        print(text, flush=True)
        texts.append(text)
    texts.insert(1, overview(results))
    print(texts[1])
    if a.out:
        with a.out.open("a") as f:
            f.write("\n" + "\n".join(texts))
    return 0


if __name__ == "__main__":
    sys.exit(main())

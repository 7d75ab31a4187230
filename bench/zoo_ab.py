"""The whole zoo in one process: torchlower now / torchlower before this issue's passes /
torch_to_nnef in tract, and onnxruntime as the far anchor, timed interleaved per model.

    python -m bench.zoo_ab [--models a,b] [--rounds 7] [--burst 10] [--out bench/results-issue16.md]

``make bench`` exports every model in fresh worker processes (torch_to_nnef's import alone is
~20 s, a dynamo ONNX export up to minutes at load 10+), too slow for 36 models on the shared
machine; here everything is imported once and each model's artifacts are timed round after round
in turn (rotating who goes first), so a loaded machine slows all alike and the ratios hold.
``tl-prev`` is torchlower without ``nnef/patches.py`` (before issue 16's third session);
``tl-before`` also has ``nnef/layout.py`` and ``nnef/rows.py`` off and the flash limit back at 48²
(the state before issue 16's second session). ONNX comes from the TorchScript
exporter (``dynamo=False``, seconds instead of minutes; onnxruntime runs either graph alike),
with 1 intra-op / 1 inter-op thread. Single-threaded tract (set here).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import math
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

from bench.exporters import exporter, load, names  # noqa: E402
from bench.worker import _flat, max_error  # noqa: E402
from bench.zoo import ZOO  # noqa: E402

RUNNERS = ("tl-jit", "tl-prev", "tl-before", "t2n", "onnx")


def _before(model: torch.nn.Module, args: tuple[torch.Tensor, ...], folder: Path) -> list[Path]:
    from torchlower.nnef import fusions, layout, rows

    saved = (layout.canonical_layout, rows.apply, fusions.MAX_FLASH_AREA, fusions.MAX_FLASH_AREA_SKIPPING)
    layout.canonical_layout, rows.apply = (lambda b: False), (lambda b: False)
    fusions.MAX_FLASH_AREA = fusions.MAX_FLASH_AREA_SKIPPING = 48 * 48
    try:
        return _prev(model, args, folder)
    finally:
        layout.canonical_layout, rows.apply, fusions.MAX_FLASH_AREA, fusions.MAX_FLASH_AREA_SKIPPING = saved


def _prev(model: torch.nn.Module, args: tuple[torch.Tensor, ...], folder: Path) -> list[Path]:
    """torchlower without ``nnef/patches.py`` (the state before issue 16's third session)."""
    from torchlower.nnef import patches

    saved = patches.patch_matmul
    patches.patch_matmul = lambda b: False
    try:
        return exporter("tl-jit").export(model, args, folder)
    finally:
        patches.patch_matmul = saved


def _onnx(model: torch.nn.Module, args: tuple[torch.Tensor, ...], folder: Path) -> list[Path]:
    import warnings

    path = folder / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, str(path), dynamo=False, input_names=names(len(args), "input"))
    return [path]


def _export(name: str, model: torch.nn.Module, args: tuple[torch.Tensor, ...], folder: Path) -> Path:
    if name == "tl-before":
        return _before(model, args, folder)[0]
    if name == "tl-prev":
        return _prev(model, args, folder)[0]
    if name == "onnx":
        return _onnx(model, args, folder)[0]
    return exporter(name).export(model, args, folder)[0]


def _time(runs: dict[str, Any], inputs: list[np.ndarray], rounds: int, burst: int) -> dict[str, float]:
    times: dict[str, list[float]] = {k: [] for k in runs}
    order = list(runs)
    for run in runs.values():
        for _ in range(3):
            run(inputs)
    for i in range(rounds):
        for name in order[i % len(order) :] + order[: i % len(order)]:
            run = runs[name]
            for _ in range(burst):
                t0 = time.perf_counter()
                run(inputs)
                times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def _geo(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=lambda s: s.split(","), default=list(ZOO))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--burst", type=int, default=10)
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="torchlower-zoo-ab-"))
    start_load, t_start = os.getloadavg(), time.perf_counter()
    rows: list[dict[str, Any]] = []
    for name in a.models:
        model, args = ZOO[name].build()
        model.eval()
        with torch.no_grad():
            want = _flat(model(*args))
        inputs = [t.numpy() for t in args]
        runs, loads, errors, failed, digest = {}, {}, {}, {}, {}
        for ex in RUNNERS:
            folder = root / name / ex
            folder.mkdir(parents=True)
            try:
                # a copy each: torch_to_nnef swaps the model's parameters for its NamedTensor
                # subclass, which a later exporter then traces as unlabelled constants
                path = _export(ex, copy.deepcopy(model), args, folder)
                digest[ex] = hashlib.sha256(path.read_bytes()).hexdigest()
                loaded = load("ort" if ex == "onnx" else "tract", path, time.perf_counter)
                runs[ex], loads[ex] = loaded.run, sum(loaded.steps.values())
                errors[ex] = max_error(want, loaded.run(inputs))
            except Exception as exc:  # a failing exporter is reported, not fatal
                failed[ex] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        med = _time(runs, inputs, a.rounds, a.burst) if runs else {}
        row = {"model": name, "family": ZOO[name].family, "us": {k: v * 1e6 for k, v in med.items()},
               "load_ms": {k: v * 1e3 for k, v in loads.items()}, "err": errors, "failed": failed,
               "loadavg": os.getloadavg()[0],
               "same_as_prev": None is not digest.get("tl-jit") == digest.get("tl-prev")}  # fmt: skip
        rows.append(row)
        cells = "  ".join(f"{k} {v * 1e6:9.1f}µs" for k, v in med.items())
        ratio = f"  now/t2n {med['tl-jit'] / med['t2n']:.3f}" if {"tl-jit", "t2n"} <= set(med) else ""
        print(f"{name:22s} {cells}{ratio}  load {row['loadavg']:.2f}  {failed or ''}", flush=True)
    text = report(rows, start_load, os.getloadavg())
    text += f"\nWall time of this run: {(time.perf_counter() - t_start) / 60:.1f} min.\n"
    print(text)
    if a.out:
        a.out.write_text(text + _notes(a.out))
    return 0


NOTES = "\n## Notes"  # a hand-written section of the --out file (profiles, analysis) is kept


def _notes(path: Path) -> str:
    """The hand-written part of an earlier report at ``path``, from ``NOTES`` on ("" if none)."""
    old = path.read_text() if path.exists() else ""
    return old[old.index(NOTES) :] if NOTES in old else ""


def report(rows: list[dict[str, Any]], start: tuple[float, ...], end: tuple[float, ...]) -> str:
    def ratios(x: str, y: str, metric: str = "us") -> dict[str, float]:
        return {r["model"]: r[metric][x] / r[metric][y] for r in rows if x in r[metric] and y in r[metric]}

    fam: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        fam[r["family"]].append(r["model"])
    now, before, anchor = ratios("tl-jit", "t2n"), ratios("tl-before", "t2n"), ratios("tl-jit", "onnx")
    prev = ratios("tl-prev", "t2n")
    t2n_ort = ratios("t2n", "onnx")
    goal = {"attention": 0.85, "transformers": 0.85}
    out = [
        "# Issue 16: tract inference of torchlower's artifacts vs torch_to_nnef's, whole zoo"
        " (bench/zoo_ab.py)",
        "",
        f"One process, interleaved per model, 1 thread, medians; load average {start[0]:.1f} at start,"
        " "
        f"{end[0]:.1f} at end (machine shared: ratios, not absolute times). tract 0.23.9. "
        "`prev` = torchlower without the patch-embedding matmul (`nnef/patches.py`, the state before"
        " issue 16's third session); `before` = also without the layout chains, row reductions and"
        " with the flash limit at 48² (before the second session).",
        "",
        "| family | models | before / t2n | prev / t2n | now / t2n | goal | slowest now / t2n"
        " | now / onnxruntime | t2n / onnxruntime |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for f, models in [*sorted(fam.items()), ("all", [r["model"] for r in rows])]:
        got = [now[m] for m in models if m in now]
        worst = max(((now[m], m) for m in models if m in now), default=(float("nan"), "-"))
        g = goal.get(f, 0.9 if f == "all" else 1.0)
        was = _geo([before[m] for m in models if m in before])
        out.append(
            f"| {f} | {len(got)} | {was:.3f} | {_geo([prev[m] for m in models if m in prev]):.3f} | "
            f"{_geo(got):.3f} | "
            f"≤ {g} | {worst[0]:.3f} ({worst[1]}) | {_geo([anchor[m] for m in models if m in anchor]):.2f} | "
            f"{_geo([t2n_ort[m] for m in models if m in t2n_ort]):.2f} |"
        )
    same = [r["model"] for r in rows if r.get("same_as_prev") and {"tl-jit", "tl-prev"} <= set(r["us"])]
    control = ratios("tl-jit", "tl-prev")
    spread = [control[m] for m in same]
    if spread:
        out += [
            "",
            f"Noise control: on the {len(same)} models where `now` and `prev` are byte-identical archives,"
            f" now / prev has geomean {_geo(spread):.3f} (range {min(spread):.3f}–{max(spread):.3f}):"
            " differences of that size between two exporters are not signal.",
        ]
    lo = ratios("tl-jit", "t2n", "load_ms")
    lo_b = ratios("tl-before", "t2n", "load_ms")
    out += [
        "",
        f"Load + optimize in tract, geomean over {len(lo)} models: now / t2n {_geo(list(lo.values())):.3f}, "
        f"before / t2n {_geo(list(lo_b.values())):.3f}.",
        "",
        "| model | family | now µs | prev µs | before µs | t2n µs | onnxruntime µs | now/t2n | prev/t2n"
        " | before/t2n | now/ort | max err now | load ms now / t2n | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        us, m = r["us"], r["model"]

        def c(k: str, us: dict[str, float] = us) -> str:
            return f"{us[k]:.1f}" if k in us else "failed"

        def q(d: dict[str, float], m: str = m) -> str:
            return f"{d[m]:.3f}" if m in d else "–"

        load = r["load_ms"]
        lcell = f"{load['tl-jit']:.1f} / {load['t2n']:.1f}" if {"tl-jit", "t2n"} <= set(load) else "–"
        err = f"{r['err']['tl-jit']:.1e}" if "tl-jit" in r["err"] else "–"
        out.append(
            f"| {m} | {r['family']} | {c('tl-jit')} | {c('tl-prev')} | {c('tl-before')} | {c('t2n')} | "
            f"{c('onnx')} | {q(now)} | {q(prev)} | {q(before)} | {q(anchor)} | {err} | {lcell} | "
            f"{r['loadavg']:.1f} |"
        )
    fails = [(r["model"], k, v) for r in rows for k, v in r["failed"].items()]
    if fails:
        out += ["", "| model | exporter | failure |", "|---|---|---|"]
        out += [f"| {m} | {k} | {v} |" for m, k, v in fails]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())

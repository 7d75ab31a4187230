"""tract load + optimize time of torchlower's artifacts now vs before issue 16, interleaved.

    python -m bench.load_ab [--models a,b] [--rounds 15] [--runners tl-jit,tl-before,git:147a5ff]
                            [--variants] [--out FILE]

Only the loading is timed (``nnef.load`` = parse, ``into_runnable`` = declutter + optimize), each
artifact loaded ``--rounds`` times in turn, rotating who goes first, single-threaded; medians.
Runners:

- ``tl-jit``: torchlower as it is;
- ``tl-before``: this tree with the issue's passes switched off (``bench/zoo_ab.py``'s ``before``:
  no layout chains, row reductions, patch matmul, flash limit back at 48²) — it still has
  ``guards.wide_extrema`` and every later change outside those passes;
- ``git:REV``: the ``torchlower`` package of commit REV (``git archive`` into a temporary folder)
  exporting the same zoo models in a subprocess: the real "before". ``147a5ff`` is where issue 16's
  branch started.

``--variants`` adds this tree with one pass off at a time (``-wide``: ``guards.wide_extrema``,
``-layout``, ``-rows``, ``-patches``, ``-fusions``), so a load-time cost can be pinned to a pass.
Models whose archives are byte-identical between two runners give the noise control.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

for _k, _v in (("RAYON_NUM_THREADS", "1"), ("TRACT_FLASH_SDPA_ST", "1"), ("OMP_NUM_THREADS", "1")):
    os.environ.setdefault(_k, _v)

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.exporters import exporter  # noqa: E402
from bench.zoo import ZOO  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("tl-wide", "tl-layout", "tl-rows", "tl-patches", "tl-fusions")


@contextlib.contextmanager
def _off(which: str) -> Iterator[None]:
    """This tree's torchlower with one of its passes replaced by a no-op (``which`` after ``tl-``)."""
    from torchlower.nnef import fusions, guards, layout, patches, rows

    module, attr = {
        "wide": (guards, "wide_extrema"),
        "layout": (layout, "canonical_layout"),
        "rows": (rows, "apply"),
        "patches": (patches, "patch_matmul"),
        "fusions": (fusions, "fuse_attention"),
    }[which]
    saved = getattr(module, attr)
    setattr(module, attr, lambda b: False)
    try:
        yield
    finally:
        setattr(module, attr, saved)


def _export_here(runner: str, name: str, folder: Path) -> Path:
    model, args = ZOO[name].build()
    model.eval()
    if runner == "tl-before":
        from bench import zoo_ab

        return zoo_ab._export("tl-before", model, args, folder)
    if runner == "tl-jit":
        return exporter("tl-jit").export(copy.deepcopy(model), args, folder)[0]
    with _off(runner.removeprefix("tl-")):
        return exporter("tl-jit").export(copy.deepcopy(model), args, folder)[0]


_CHILD = """
import json, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
from bench.exporters import exporter
from bench.zoo import ZOO
import torchlower
out = {"__file__": torchlower.__file__}
for name, folder in json.loads(sys.argv[1]).items():
    model, args = ZOO[name].build()
    model.eval()
    try:
        out[name] = str(exporter("tl-jit").export(model, args, Path(folder))[0])
    except Exception as exc:
        out[name] = "failed: " + type(exc).__name__ + ": " + str(exc).splitlines()[0][:120]
print("RESULT " + json.dumps(out))
"""


def _export_git(rev: str, folders: dict[str, Path], scratch: Path) -> dict[str, str]:
    """Export the models with the ``torchlower`` package of commit ``rev`` (bench/ from this tree)."""
    tree = scratch / f"torchlower-{rev}"
    if not tree.exists():
        tree.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "torchlower"], check=True,
                                 capture_output=True).stdout  # fmt: skip
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    env = {**os.environ, "PYTHONPATH": f"{tree}:{ROOT}"}
    job = json.dumps({k: str(v) for k, v in folders.items()})
    done = subprocess.run([sys.executable, "-c", _CHILD, job], env=env, cwd=tree, capture_output=True,
                          text=True)  # fmt: skip
    line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        raise RuntimeError(f"git:{rev} export failed: {done.stderr[-2000:]}")
    out = json.loads(line[0][len("RESULT ") :])
    if not out.pop("__file__").startswith(str(tree)):  # the editable install must not win
        raise RuntimeError(f"git:{rev}: the child imported another torchlower")
    return out


def _load_once(nnef: Any, path: Path) -> tuple[float, float]:
    t0 = time.perf_counter()
    model = nnef.load(str(path))
    t1 = time.perf_counter()
    runnable = model.into_runnable()
    t2 = time.perf_counter()
    del runnable, model  # freed outside the timed span
    return t1 - t0, t2 - t1


def _geo(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", type=lambda s: s.split(","), default=list(ZOO))
    p.add_argument("--runners", type=lambda s: s.split(","), default=["tl-jit", "tl-before", "git:147a5ff"])
    p.add_argument("--variants", action="store_true", help="add this tree with one pass off at a time")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", type=Path, default=None, help="append the markdown table to this file")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    import tract

    nnef = tract.nnef().with_tract_extra().with_tract_transformers()
    runners = [*a.runners, *(VARIANTS if a.variants else ())]
    root = Path(tempfile.mkdtemp(prefix="torchlower-load-ab-"))
    paths: dict[str, dict[str, Path]] = {r: {} for r in runners}
    failed: list[str] = []
    for r in runners:
        folders = {m: root / m / r.replace(":", "-") for m in a.models}
        for f in folders.values():
            f.mkdir(parents=True)
        if r.startswith("git:"):
            for m, got in _export_git(r[4:], folders, root).items():
                if got.startswith("failed"):
                    failed.append(f"{m} {r}: {got}")
                else:
                    paths[r][m] = Path(got)
            continue
        for m in a.models:
            try:
                paths[r][m] = _export_here(r, m, folders[m])
            except Exception as exc:
                failed.append(f"{m} {r}: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
    start_load = os.getloadavg()
    print(f"load average {start_load[0]:.2f} {start_load[1]:.2f} {start_load[2]:.2f}", flush=True)
    rows = []
    for m in a.models:
        have = [r for r in runners if m in paths[r]]
        digest = {r: hashlib.sha256(paths[r][m].read_bytes()).hexdigest() for r in have}
        times: dict[str, list[tuple[float, float]]] = {r: [] for r in have}
        for r in have:
            _load_once(nnef, paths[r][m])  # warm the file cache and tract's registries
        for i in range(a.rounds):
            for r in have[i % len(have) :] + have[: i % len(have)]:
                times[r].append(_load_once(nnef, paths[r][m]))
        med = {r: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v),
                   statistics.median(t[0] + t[1] for t in v)) for r, v in times.items()}  # fmt: skip
        row = {"model": m, "ms": {r: tuple(x * 1e3 for x in v) for r, v in med.items()},
               "digest": digest, "loadavg": os.getloadavg()[0]}  # fmt: skip
        rows.append(row)
        cells = "  ".join(f"{r} {row['ms'][r][2]:6.1f}" for r in have)
        print(f"{m:22s} {cells}  load {row['loadavg']:.2f}", flush=True)
    text = report(rows, runners, start_load, os.getloadavg(), a.rounds, failed)
    print(text)
    if a.out:
        with a.out.open("a") as f:
            f.write("\n" + text)
    return 0


def report(rows: list[dict[str, Any]], runners: list[str], start: tuple[float, ...],
           end: tuple[float, ...], rounds: int, failed: list[str]) -> str:  # fmt: skip
    base = runners[0]
    out = [
        f"Load + optimize in tract (bench/load_ab.py, {rounds} rounds interleaved, medians, 1 thread;"
        f" load average {start[0]:.1f} at start, {end[0]:.1f} at end). Ratios are {base} / runner.",
        "",
        "| runner | models | geomean total | geomean parse | geomean optimize | differing archives:"
        " geomean | identical archives: geomean (noise) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runners[1:]:
        both = [x for x in rows if base in x["ms"] and r in x["ms"]]
        ratio = [[x["ms"][base][k] / x["ms"][r][k] for x in both] for k in range(3)]
        same = [x["ms"][base][2] / x["ms"][r][2] for x in both if x["digest"][base] == x["digest"][r]]
        diff = [x["ms"][base][2] / x["ms"][r][2] for x in both if x["digest"][base] != x["digest"][r]]
        out.append(
            f"| {r} | {len(both)} | {_geo(ratio[2]):.3f} | {_geo(ratio[0]):.3f} | {_geo(ratio[1]):.3f} | "
            f"{_geo(diff):.3f} ({len(diff)}) | {_geo(same):.3f} ({len(same)}) |"
        )
    out += ["", "| model | " + " | ".join(f"{r} ms" for r in runners) + " | differs from "
            + base + " | load avg |", "|---|" + "---|" * (len(runners) + 2)]  # fmt: skip
    for x in rows:
        cells = " | ".join(f"{x['ms'][r][2]:.1f}" if r in x["ms"] else "–" for r in runners)
        differs = ", ".join(
            r for r in runners[1:] if r in x["digest"] and x["digest"][r] != x["digest"][base]
        )
        out.append(f"| {x['model']} | {cells} | {differs or '–'} | {x['loadavg']:.1f} |")
    if failed:
        out += ["", *[f"- failed: {f}" for f in failed]]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.exit(main())

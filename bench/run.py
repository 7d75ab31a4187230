"""``make bench``: torchlower vs torch_to_nnef vs torch.onnx.export + onnxruntime, one run.

    python bench/run.py [--quick] [--models a,b] [--exporters tl-jit,t2n] [--no-bigmem] [--no-profile]

Writes ``bench/results.json`` and ``bench/results.md``. Models are measured interleaved: for
each model every exporter runs in turn (rotating the order), so machine noise spreads evenly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.exporters import EXPORTERS, single_threaded_env
from bench.workers import ROOT, Worker, family_of
from bench.zoo import ZOO

IMPORTS = {
    "python (no import)": "pass",
    "torch": "import torch",
    "torchlower": "import torchlower",
    "torchlower.api (ready to export)": "import torchlower.pipeline.export",
    "torch_to_nnef": "import torch_to_nnef",
}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def measure_zoo(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    names = args.models or [n for n, c in ZOO.items() if c.quick or not args.quick]
    workers: dict[str, Worker] = {}
    results = []
    request = {
        "repeats": args.repeats, "load_repeats": args.load_repeats, "infer_seconds": args.infer_seconds,
        "max_runs": args.max_runs, "workdir": str(workdir),
    }  # fmt: skip
    try:
        for i, name in enumerate(names):
            order = args.exporters[i % len(args.exporters) :] + args.exporters[: i % len(args.exporters)]
            for ex in order:
                family = family_of(ex)
                worker = workers.setdefault(family, Worker(family, workdir))
                t0 = time.perf_counter()
                res = worker.ask(
                    {**request, "model": name, "exporter": ex, "torch_infer": ex == args.exporters[0]},
                    timeout=args.timeout,
                )
                res.update(model=name, family=ZOO[name].family, exporter=ex)
                results.append(res)
                status = "ok" if res["ok"] else f"FAILED in {res['failed_in']}: {res['error'][:150]}"
                log(f"{name:22s} {ex:9s} {time.perf_counter() - t0:6.1f} s  {status}")
    finally:
        for w in workers.values():
            w.stop()
    return results


def _wall(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def measure_imports(repeats: int) -> dict[str, dict[str, Any]]:
    """Wall time of a fresh interpreter importing each module, interleaved, median of ``repeats``."""
    env = single_threaded_env()
    times: dict[str, list[float]] = {k: [] for k in IMPORTS}
    for code in IMPORTS.values():  # warm the page cache once
        _wall([sys.executable, "-c", code], env)
    for _ in range(repeats):
        for k, code in IMPORTS.items():
            times[k].append(_wall([sys.executable, "-c", code], env))
    return {k: {"median_s": statistics.median(v), "runs_s": v} for k, v in times.items()}


def _child_json(cmd: list[str], timeout: float) -> list[dict[str, Any]]:
    proc = subprocess.run(
        cmd, cwd=ROOT, env=single_threaded_env(), capture_output=True, text=True, timeout=timeout
    )
    rows = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 and not rows:
        tail = " | ".join(proc.stderr.strip().splitlines()[-3:])[-500:]
        rows = [{"ok": False, "error": f"exit status {proc.returncode}: {tail}"}]
    return rows


def measure_bigmem(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    rows = []
    for ex, width in args.bigmem_cases:
        log(f"big model ({args.bigmem_bytes / 2**30:.2f} GiB of f32 weights, width {width}): {ex}")
        try:
            cmd = [sys.executable, "-m", "bench.bigmem", ex, str(args.bigmem_bytes), str(width)]
            got = _child_json([*cmd, str(workdir)], 900)
        except subprocess.TimeoutExpired:
            got = [{"ok": False, "error": "timeout after 900 s"}]
        rows.append({"exporter": ex, **got[0]})
        log(f"  {rows[-1]}")
    return rows


def measure_profile(
    args: argparse.Namespace, results: list[dict[str, Any]], workdir: Path
) -> list[dict[str, Any]]:
    """cProfile torchlower on the models it exports where it is slowest relative to the floor."""
    out = []
    for frontend in ("jit", "export"):
        ok = [r for r in results if r["exporter"] == f"tl-{frontend}" and r.get("export_s")]
        ok.sort(key=lambda r: statistics.median(r["export_s"]), reverse=True)
        names = [r["model"] for r in ok[: args.profile_models]]
        if names:
            log(f"profiling torchlower ({frontend}) on {', '.join(names)}")
            out += _child_json(
                [sys.executable, "-m", "bench.profile_export", frontend, "5", str(workdir), *names], 600
            )
    return out


def environment() -> dict[str, Any]:
    versions = {}
    code = (
        "import importlib.metadata as m, json; print(json.dumps({p: m.version(p) for p in "
        "['torch', 'tract', 'torch_to_nnef', 'onnx', 'onnxruntime', 'onnxscript', 'transformers', 'numpy']}))"
    )
    with contextlib.suppress(json.JSONDecodeError, OSError):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        versions = json.loads(proc.stdout)
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        )
        versions["torchlower commit"] = commit.stdout.strip()
    except OSError:
        pass
    return {
        "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(), "versions": versions,
    }  # fmt: skip


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="5 models, few repeats, 256 MiB memory test")
    p.add_argument("--models", type=lambda s: s.split(","), default=None)
    p.add_argument("--exporters", type=lambda s: s.split(","), default=list(EXPORTERS))
    p.add_argument("--out", type=Path, default=ROOT / "bench")
    p.add_argument("--no-bigmem", action="store_true")
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--report-only", action="store_true", help="re-render results.md from results.json")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per model and exporter")
    a = p.parse_args(argv)
    unknown = [m for m in a.models or [] if m not in ZOO]
    if unknown:
        p.error(f"unknown models {unknown}; the zoo has {sorted(ZOO)}")
    a.repeats = 2 if a.quick else 5
    a.load_repeats = 2 if a.quick else 3
    a.infer_seconds = 0.05 if a.quick else 0.3
    a.max_runs = 200 if a.quick else 2000
    a.import_repeats = 3 if a.quick else 7
    a.bigmem_bytes = (1 << 28) if a.quick else (1 << 30)
    # 4 square layers; for tl-jit also one single tensor holding all weights (the worst case
    # for a writer that copies tensor by tensor)
    width = 4096 if a.quick else 8192
    cases = [("tl-jit", width), ("tl-jit", 2 * width), ("tl-export", width), ("t2n", width)]
    a.bigmem_cases = [(e, w) for e, w in cases if e in a.exporters]
    a.profile_models = 2 if a.quick else 4
    return a


def main(argv: list[str] | None = None) -> int:
    from bench.report import write_markdown

    args = parse(argv)
    stem = "results-quick" if args.quick else "results"
    if args.report_only:
        data = json.loads((args.out / f"{stem}.json").read_text())
        (args.out / f"{stem}.md").write_text(write_markdown(data, data.get("finished")))
        return 0
    started = time.time()
    data: dict[str, Any] = {"environment": environment(), "quick": args.quick, "exporters": args.exporters}
    with tempfile.TemporaryDirectory(prefix="torchlower-bench-") as tmp:
        workdir = Path(tmp)
        log(f"zoo: {len(args.models or ZOO)} models × {args.exporters}; scratch {workdir}")
        data["models"] = measure_zoo(args, workdir)
        log("import times (fresh interpreters)")
        data["imports"] = measure_imports(args.import_repeats)
        data["bigmem"] = [] if args.no_bigmem else measure_bigmem(args, workdir)
        data["profile"] = [] if args.no_profile else measure_profile(args, data["models"], workdir)
        logs = {p.name: p.read_text(errors="replace")[-20000:] for p in workdir.glob("worker-*.log")}
    data["environment"]["loadavg_end"] = os.getloadavg()
    data["wall_s"] = time.time() - started
    data["finished"] = time.strftime("%Y-%m-%d %H:%M")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
    (args.out / f"{stem}.md").write_text(write_markdown(data, data["finished"]))
    (args.out / f"{stem}-worker-logs.txt").write_text(
        "\n".join(f"==== {k}\n{v}" for k, v in sorted(logs.items()))
    )
    log(f"wrote {args.out / stem}.md / .json in {data['wall_s'] / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())

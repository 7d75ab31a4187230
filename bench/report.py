"""``bench/results.md`` from the run's JSON: targets, per-model tables, pairwise ratios."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.exporters import PAIRS

Row = dict[str, Any]
MiB = 1 << 20


def _median(xs: list[float] | None) -> float | None:
    return statistics.median(xs) if xs else None


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


# metric name → (getter on a result row, unit label, formatter)
METRICS: dict[str, tuple[Callable[[Row], float | None], str]] = {
    "export time": (lambda r: _median(r.get("export_s")), "ms"),
    "export peak RSS Δ": (lambda r: r.get("export_rss_delta"), "MiB"),
    "artifact size": (lambda r: r.get("artifact_bytes"), "KiB"),
    "load time": (lambda r: _median(r.get("load_s")) if r.get("ok") else None, "ms"),
    "inference time": (lambda r: r.get("infer_s") if r.get("ok") else None, "µs"),
}
_SCALE = {"ms": 1e3, "µs": 1e6, "MiB": 1 / MiB, "KiB": 1 / 1024}


def fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    v = value * _SCALE[unit]
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.2f}"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def by_model(models: list[Row]) -> dict[str, dict[str, Row]]:
    out: dict[str, dict[str, Row]] = {}
    for r in models:
        out.setdefault(r["model"], {})[r["exporter"]] = r
    return out


def ratios(grid: dict[str, dict[str, Row]], metric: str, a: str, b: str) -> list[float]:
    get = METRICS[metric][0]
    out = []
    for row in grid.values():
        if a in row and b in row:
            x, y = get(row[a]), get(row[b])
            if x and y:
                out.append(x / y)
    return out


def _status(r: Row | None) -> str:
    if r is None:
        return "–"
    if r.get("ok"):
        return "ok"
    short = r["error"].replace("|", "/").replace("\n", " ")
    return f"failed ({r['failed_in']}): {short[:70]}"


def targets(data: dict[str, Any], grid: dict[str, dict[str, Row]]) -> list[list[str]]:
    rows: list[list[str]] = []

    def add(name: str, goal: str, value: float | None, ok: bool | None, how: str) -> None:
        shown = "n/a" if value is None else f"{value:.3g}"
        verdict = "not measured" if ok is None else "**met**" if ok else "**missed**"
        rows.append([name, goal, shown, verdict, how])

    def ratio_target(name: str, metric: str, a: str, b: str, goal: float, agg: str) -> None:
        rs = ratios(grid, metric, a, b)
        v = (statistics.median(rs) if agg == "median" else geomean(rs)) if rs else None
        add(name, f"{agg} ≤ {goal}", v, None if v is None else v <= goal, f"{len(rs)} models both exported")

    ratio_target("export time, jit front end", "export time", "tl-jit", "t2n", 0.3, "median")
    ratio_target("export time, export front end", "export time", "tl-export", "onnx", 0.2, "median")
    imp = data.get("imports", {})
    if "torch" in imp:
        torch_s = imp["torch"]["median_s"]
        for key in ("torchlower", "torchlower.api (ready to export)"):
            if key in imp:
                v = imp[key]["median_s"] / torch_s
                add(f"import {key} / import torch", "≤ 1.2", v, v <= 1.2, "fresh interpreters, medians")
    ratio_target(
        "tract inference, ours vs torch_to_nnef's", "inference time", "tl-jit", "t2n", 0.9, "geomean"
    )
    ratio_target("tract load+optimize, ours vs torch_to_nnef's", "load time", "tl-jit", "t2n", 1.0, "geomean")
    for big in data.get("bigmem", []):
        if big["exporter"].startswith("tl-"):
            v = big["peak_above_baseline"] / big["weight_bytes"] if big.get("ok") else None
            how = (
                f"{big['weight_bytes'] / 2**30:.2f} GiB weights, largest tensor "
                f"{big['largest_tensor_bytes'] / MiB:.0f} MiB"
                if big.get("ok")
                else big.get("error", "")[:80]
            )
            add(
                f"peak RSS / weight bytes, {big['exporter']}",
                "≤ 1.25",
                v,
                None if v is None else v <= 1.25,
                how,
            )
    for ex in ("tl-jit", "tl-export"):
        extra = [
            (r["tensor_payload_bytes"] / r["weight_bytes"] - 1, model)
            for model, row in grid.items()
            if (r := row.get(ex)) and r.get("tensor_payload_bytes") is not None and r["weight_bytes"]
        ]
        if extra:
            worst, model = max(extra)
            how = f"{len(extra)} models; worst: {model} (value in %; tar/.dat framing excluded)"
            add(
                f"stored tensor bytes over raw f32 weights, {ex} (worst)",
                "≤ 1 %",
                100 * worst,
                worst <= 0.01,
                how,
            )
    sizes = [
        r["artifact_bytes"] / r["weight_bytes"] - 1
        for row in grid.values()
        if (r := row.get("tl-jit")) and r.get("artifact_bytes") and r["weight_bytes"] >= MiB
    ] + [
        b["artifact_bytes"] / b["weight_bytes"] - 1
        for b in data.get("bigmem", [])
        if b.get("ok") and b["exporter"] == "tl-jit"
    ]
    v = max(sizes) if sizes else None
    how = f"{len(sizes)} models with ≥ 1 MiB of weights (value in %)"
    pct = None if v is None else 100 * v
    add(
        "whole .nnef.tar (incl. tar framing) over raw f32 weights, tl-jit (worst)",
        "≤ 1 %",
        pct,
        None if v is None else v <= 0.01,
        how,
    )
    return rows


def write_markdown(data: dict[str, Any], finished: str | None = None) -> str:
    grid = by_model(data["models"])
    exporters: list[str] = data["exporters"]
    env = data["environment"]
    md = [
        "# torchlower benchmark" + (" (--quick)" if data.get("quick") else ""),
        "",
        f"Run {finished or time.strftime('%Y-%m-%d %H:%M')}, {data['wall_s'] / 60:.1f} min, "
        f"Python {env['python']}, "
        f"{env['cpus']} CPUs, load average {env['loadavg_start'][0]:.1f} at start / "
        f"{env['loadavg_end'][0]:.1f} at end.",
        "",
        "Versions: " + ", ".join(f"{k} {v}" for k, v in env["versions"].items()) + ".",
        "",
        "Exporters: **tl-jit** / **tl-export** = torchlower with the jit / export front end "
        "(`check=False`); **t2n** = torch_to_nnef TractNNEF (`check_io=False`, local tract shim, no "
        "download); **onnx** = `torch.onnx.export(dynamo=True)`. NNEF archives (`.nnef.tar`) run in "
        "tract (Python package, `RAYON_NUM_THREADS=1`, `TRACT_FLASH_SDPA_ST=1`), ONNX in onnxruntime "
        "(1 intra-op / 1 inter-op thread). Exports run with one torch thread on fresh copies of the "
        "model; times are medians of warm repeats (a cold first call is in the JSON).",
        "",
        "> **Noise:** the machine was shared with other jobs during this run (see the load average), "
        "so absolute timings are noisy; ratios are more robust because exporters are interleaved "
        "per model. A quiet run replaces these numbers later.",
        "",
        "## Targets (issue 9)",
        "",
        *table(["target", "goal", "measured", "verdict", "basis"], targets(data, grid)),
        "",
        "## Pairwise ratios (first / second; < 1 means the first is better)",
        "",
    ]
    rows = []
    for a, b in PAIRS:
        if a not in exporters or b not in exporters:
            continue
        for metric in METRICS:
            rs = ratios(grid, metric, a, b)
            if rs:
                med, geo = statistics.median(rs), geomean(rs)
                spread = f"{min(rs):.3g} – {max(rs):.3g}"
                rows.append([f"{a} / {b}", metric, str(len(rs)), f"{med:.3g}", f"{geo:.3g}", spread])
    md += [*table(["pair", "metric", "models", "median", "geomean", "range"], rows), ""]
    md += _families(data["models"], grid, exporters)
    md += [f"> {note}" for note in data.get("notes", [])] + ([""] if data.get("notes") else [])
    md += _coverage(grid, exporters)
    md += _per_metric_tables(grid, exporters)
    md += _errors_table(grid, exporters)
    md += _failures(grid, exporters)
    md += _imports(data.get("imports", {}))
    md += _bigmem(data.get("bigmem", []))
    md += _profile(data.get("profile", []))
    return "\n".join(md) + "\n"


# issue 16: tract inference of ours vs torch_to_nnef's per family (goal ≤ 1.0, attention and
# Hugging Face ≤ 0.85, overall ≤ 0.9, no model above 1.1); onnxruntime as the far anchor
_FAMILY_GOAL = {"attention": 0.85, "transformers": 0.85}


def _families(models: list[Row], grid: dict[str, dict[str, Row]], exporters: list[str]) -> list[str]:
    if "t2n" not in exporters:
        return []
    family = {r["model"]: r["family"] for r in models}
    get = METRICS["inference time"][0]
    rows = []
    for ours in (e for e in ("tl-jit", "tl-export") if e in exporters):
        per: dict[str, list[tuple[float, str]]] = {}
        anchor: dict[str, list[float]] = {}
        for model, row in grid.items():
            x = get(row[ours]) if ours in row else None
            y = get(row["t2n"]) if "t2n" in row else None
            z = get(row["onnx"]) if "onnx" in row else None
            if x and y:
                per.setdefault(family[model], []).append((x / y, model))
            if x and z:
                anchor.setdefault(family[model], []).append(x / z)
        every = [r for rs in per.values() for r in rs]
        for fam, rs in [*sorted(per.items()), ("all", every)]:
            goal = 0.9 if fam == "all" else _FAMILY_GOAL.get(fam, 1.0)
            geo = geomean([r for r, _ in rs])
            worst, name = max(rs)
            onnx = anchor.get(fam) if fam != "all" else [r for v in anchor.values() for r in v]
            verdict = "**met**" if geo <= goal else "**missed**"
            rows.append([
                ours, fam, str(len(rs)), f"{geo:.3g}", f"≤ {goal}", verdict,
                f"{worst:.3g} ({name})", f"{geomean(onnx):.3g}" if onnx else "–",
            ])  # fmt: skip
    header = ["ours", "family", "models", "vs t2n geomean", "goal", "verdict", "slowest vs t2n",
              "vs onnxruntime geomean"]  # fmt: skip
    return [
        "## Tract inference by family, ours / torch_to_nnef's (issue 16)",
        "",
        "Goal: every family ≤ 1.0, attention and transformers ≤ 0.85, all ≤ 0.9, no model above 1.1; "
        "onnxruntime is the far anchor (ours / onnxruntime, < 1 would mean faster than it).",
        "",
        *table(header, rows),
        "",
    ]


def _coverage(grid: dict[str, dict[str, Row]], exporters: list[str]) -> list[str]:
    rows = []
    for ex in exporters:
        rs = [row[ex] for row in grid.values() if ex in row]
        exported = sum(1 for r in rs if r.get("export_s"))
        rows.append([ex, str(len(rs)), str(exported), str(sum(1 for r in rs if r.get("ok")))])
    return ["## Coverage", "", *table(["exporter", "models", "exported", "exported and ran"], rows), ""]


def _per_metric_tables(grid: dict[str, dict[str, Row]], exporters: list[str]) -> list[str]:
    md: list[str] = []
    pairs = [(a, b) for a, b in PAIRS[:2] if a in exporters and b in exporters]
    for metric, (get, unit) in METRICS.items():
        header = ["model", *exporters]
        extra = ["torch eager"] if metric == "inference time" else []
        floors = ["jit.trace", "torch.export"] if metric == "export time" else []
        header += extra + floors + [f"{a}/{b}" for a, b in pairs]
        rows = []
        for model, row in grid.items():
            cells = [model]
            for ex in exporters:
                r = row.get(ex)
                value = get(r) if r else None
                cells.append(
                    fmt(value, unit) if value is not None else ("failed" if r and not r.get("ok") else "–")
                )
            if extra:
                first = next((r for r in row.values() if r.get("torch_infer_s")), None)
                cells.append(fmt(first["torch_infer_s"], unit) if first else "–")
            if floors:
                for ex in ("tl-jit", "onnx"):  # where jit.trace / torch.export were timed
                    floor = _median(row[ex].get("floor_s")) if ex in row else None
                    cells.append(fmt(floor, unit) if floor else "–")
            for a, b in pairs:
                x, y = (get(row[a]) if a in row else None), (get(row[b]) if b in row else None)
                cells.append(f"{x / y:.3g}" if x and y else "–")
            rows.append(cells)
        md += [f"## {metric[0].upper()}{metric[1:]} ({unit})", "", *table(header, rows), ""]
    return md


def _errors_table(grid: dict[str, dict[str, Row]], exporters: list[str]) -> list[str]:
    rows = []
    for model, row in grid.items():
        wb = next((r["weight_bytes"] for r in row.values() if "weight_bytes" in r), None)
        cells = [model, fmt(wb, "KiB") if wb is not None else "–"]
        for ex in exporters:
            r = row.get(ex)
            cells.append(f"{r['max_abs_error']:.2g}" if r and "max_abs_error" in r else "–")
        rows.append(cells)
    return ["## Max |runtime − PyTorch| and raw weight size", "",
            *table(["model", "f32 weights (KiB)", *exporters], rows), ""]  # fmt: skip


def _failures(grid: dict[str, dict[str, Row]], exporters: list[str]) -> list[str]:
    rows = [
        [model, ex, _status(row[ex])]
        for model, row in grid.items()
        for ex in exporters
        if ex in row and not row[ex].get("ok")
    ]
    return ["## Failures", "", *(table(["model", "exporter", "status"], rows) if rows else ["none"]), ""]


def _imports(imports: dict[str, Any]) -> list[str]:
    if not imports:
        return []
    base = imports.get("torch", {}).get("median_s")
    rows = [
        [k, fmt(v["median_s"], "ms"), f"{v['median_s'] / base:.2f}" if base else "–"]
        for k, v in imports.items()
    ]
    return ["## Import time (fresh interpreter, wall, median)", "",
            *table(["import", "ms", "× import torch"], rows), ""]  # fmt: skip


def _bigmem(rows_in: list[Row]) -> list[str]:
    if not rows_in:
        return []
    rows = []
    for b in rows_in:
        if b.get("ok"):
            peak = b["peak_above_baseline"]
            rows.append(
                [b["exporter"], fmt(b["weight_bytes"], "MiB"), fmt(b["largest_tensor_bytes"], "MiB"),
                 fmt(b["baseline_rss"], "MiB"), fmt(peak, "MiB"), f"{peak / b['weight_bytes']:.2f}",
                 f"{b['export_s']:.1f}", fmt(b["artifact_bytes"], "MiB")]
            )  # fmt: skip
        else:
            rows.append([b["exporter"], *["–"] * 6, "failed: " + b.get("error", "")[:80]])
    header = ["exporter", "weights MiB", "largest tensor MiB", "baseline RSS MiB", "peak above baseline MiB",
              "peak / weights", "export s", "artifact MiB"]  # fmt: skip
    return [
        "## Exporting a wide MLP with ~1 GiB of f32 weights (fresh process)",
        "",
        *table(header, rows),
        "",
    ]


def _profile(profiles: list[Row]) -> list[str]:
    if not profiles:
        return []
    md = ["## Where torchlower's export time goes (cProfile, warm, per export)", ""]
    for p in profiles:
        if "error" in p:
            md += [f"- {p['model']} ({p['frontend']}): {p['error']}", ""]
            continue
        total = p["total_s"]
        phases = ", ".join(f"{k} {v * 1e3:.1f} ms ({100 * v / total:.0f} %)" for k, v in p["phases"].items())
        head = f"**{p['model']}** ({p['frontend']} front end): {total * 1e3:.1f} ms under the profiler"
        md += [f"{head} — {phases}.", ""]
        rows = [
            [f"`{f['function']}`", str(f["calls"]), f"{f['own_s'] * 1e3:.2f}", f"{f['cum_s'] * 1e3:.2f}"]
            for f in p["top_own"][:8]
        ]
        md += [*table(["function (by own time)", "calls", "own ms", "cum ms"], rows), ""]
    return md

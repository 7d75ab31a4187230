"""``torchlower run ARCHIVE [--inputs in.npz] [--out out.npz] [--time N] [--threads N] [--specialize]``"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from torchlower.cli import specs, stream_cmd
from torchlower.cli.console import Output, show_progress
from torchlower.cli.failures import short, usage_error


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "run",
        parents=[common],
        help="run an artifact on inputs from a .npz; print or save its outputs",
        description="Run ARCHIVE in tract (NNEF) and print each output's name, shape, dtype and"
        " min / max / mean. Inputs are checked against the graph's declaration first. Without"
        " --inputs, random inputs are drawn from the declared shapes (--symbol sets their sizes).",
    )
    p.add_argument("archive", metavar="ARCHIVE")
    p.add_argument("--inputs", metavar="IN.npz", help="inputs by name (or positional arr_0, arr_1, …)")
    p.add_argument("--out", metavar="OUT.npz", help="write the outputs (by name) to a .npz")
    p.add_argument("--time", type=int, default=0, metavar="N", help="run N more times; report latency")
    p.add_argument("--threads", type=int, metavar="N", help="tract threads (default: tract's own choice)")
    p.add_argument("--symbol", action="append", default=[], metavar="SYM=SIZE", help="size of a symbolic dim")
    p.add_argument("--seed", type=int, default=0, help="seed of random inputs")
    p.add_argument(
        "--specialize",
        action="store_true",
        help="optimize for these inputs' sizes first (a dynamic archive then runs as fast as a static one)",
    )
    stream_cmd.add_option(p, "feed the inputs chunk by chunk to tract's pulsed model (e.g. T=32); the"
                          " saved outputs are delay-aligned (docs/streaming.md)")  # fmt: skip
    p.add_argument("--rate", type=float, default=16000.0, help="--stream: input steps per second (RTF)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, out: Output) -> int:
    import torchlower
    from torchlower.artifact import io, runner

    target = Path(args.archive)
    if not target.exists():
        raise usage_error(f"artifact {args.archive!r} does not exist")
    if args.time < 0:
        raise usage_error("--time must be >= 0")
    from torchlower.artifact import bundled

    parts = bundled.parts_of(target)
    if parts is not None:
        listing = ", ".join(str(p) for p in parts.values())
        raise usage_error(
            f"{target} is a folder of {len(parts)} archives ({listing}): `run` takes one graph",
            f"run one part (`torchlower run {next(iter(parts.values()))}`), or the whole model with"
            f" `torchlower llm generate {target} --ids ...`.",
        )
    if args.stream:
        if args.time:
            raise usage_error("--time times whole runs; --stream reports the time per chunk")
        return stream_cmd.run(args, out)
    with show_progress(out):
        art = torchlower.load(target)
        given = specs.read_npz(args.inputs, "--inputs") if args.inputs else None
        lattice = isinstance(art, runner.LatticeArtifact)
        if given is None and lattice:
            raise usage_error(
                f"{target} is a lattice folder: give its inputs with --inputs IN.npz",
                f"its inputs are {', '.join(art.input_names)} (a sparse input is coords, features,"
                " active rows).",
            )
        if given is None:
            given = io.inputs_for(art, None, specs.symbol_sizes(args.symbol), args.seed)
        elif args.symbol:
            raise usage_error("--symbol sizes random inputs; with --inputs the sizes come from the arrays")
        options = {"specialize": True} if args.specialize and not lattice else {}
        try:
            start = time.perf_counter()
            outputs = art.run(given, threads=args.threads, **options)
            first = (time.perf_counter() - start) * 1000  # tract load + optimize (at these sizes) + one run
            times = _latency(art, given, args.threads, args.time, options)
        finally:
            art.close()
    if args.out:
        np.savez(args.out, **outputs)
    arrays = [given[n] for n in art.input_names] if isinstance(given, dict) else list(given)
    data: dict[str, Any] = {
        "ok": True,
        "path": str(target),
        "inputs": [{"name": n, **runner.statistics(a)} for n, a in zip(art.input_names, arrays, strict=True)],
        "outputs": [{"name": n, **runner.statistics(a)} for n, a in outputs.items()],
        "random_inputs": args.inputs is None,
        "engine": "the reference executor" if isinstance(art, runner.LatticeArtifact) else "tract",
        "saved": args.out,
    }
    if times:
        data["latency_ms"] = {
            "first_call": first,
            "runs": len(times),
            "median": statistics.median(times),
            "min": min(times),
            "max": max(times),
            "threads": args.threads,
        }
    out.emit(data, lambda console: render(console, data))
    return 0


def _latency(art: Any, given: Any, threads: int | None, runs: int, options: dict[str, bool]) -> list[float]:
    """Wall time of ``runs`` calls after the first (which loaded and optimized the model)."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        art.run(given, threads=threads, **options)
        times.append((time.perf_counter() - start) * 1000)
    return times


def render(console: Console, data: dict[str, Any]) -> None:
    table = Table(title=f"ran {data['path']} in {data['engine']}", title_justify="left")
    for col in ("tensor", "shape", "dtype", "min", "max", "mean"):
        table.add_column(col)
    for kind, rows in (("in ", data["inputs"]), ("out", data["outputs"])):
        for t in rows:
            stats = [short(t[k]) if k in t else "" for k in ("min", "max", "mean")]
            table.add_row(f"{kind} {t['name']}", _shape(t["shape"]), t["dtype"], *stats)
    console.print(table)
    if data["random_inputs"]:
        console.print("inputs were random (give --inputs IN.npz for your own)")
    if data["saved"]:
        console.print(f"outputs saved to {data['saved']}")
    if "latency_ms" in data:
        t = data["latency_ms"]
        console.print(
            f"latency over {t['runs']} runs: median {t['median']:.3f} ms (min {t['min']:.3f}, max"
            f" {t['max']:.3f}), threads {t['threads'] or 'default'}; the first call (tract load +"
            f" optimize + run) took {t['first_call']:.0f} ms"
        )


def _shape(shape: list[Any]) -> str:
    return "×".join(str(d) for d in shape) if shape else "scalar"

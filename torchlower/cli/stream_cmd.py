"""``--stream T=32`` of ``export``, ``check`` and ``run``: tract's pulsed model (docs/streaming.md)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from torchlower.cli import specs
from torchlower.cli.console import Output, show_progress
from torchlower.cli.failures import output_error, short, usage_error


def add_option(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--stream", metavar="SYM=PULSE", help=what)


def pulses(text: str) -> dict[str, int]:
    """``T=16`` → ``{"T": 16}``."""
    m = re.fullmatch(r"([A-Za-z_]\w*)=(\d+)", text)
    if m is None:
        raise usage_error(f"--stream {text!r}: expected SYMBOL=PULSE", "e.g. --stream T=16.")
    return {m.group(1): int(m.group(2))}


def report_json(report: Any) -> dict[str, Any]:
    """``report.stream`` (a ``StreamReport``) as JSON."""
    seconds = report.chunk_seconds
    return {
        "symbol": report.symbol,
        "pulse": report.pulse,
        "delay": report.delay,
        "delays": dict(report.delays),
        "pulse_multiple": report.multiple,
        "input_axes": dict(report.input_axes),
        "output_axes": dict(report.output_axes),
        "max_abs_error": report.max_abs_error,
        "chunk_ms": {
            "chunks": len(seconds),
            "mean": 1000 * sum(seconds) / len(seconds) if seconds else None,
            "max": 1000 * max(seconds) if seconds else None,
        },
        "points": [
            {
                "label": p.label,
                "length": p.length,
                "chunks": p.chunks,
                "outputs": [output_error(e) for e in p.errors],
            }
            for p in report.points
        ],
    }


def render_report(table: Table, data: dict[str, Any]) -> None:
    """Rows of a stream check: pulse, delay, axes, per-point errors and chunk time."""
    table.add_row("stream", f"{data['symbol']} pulse {data['pulse']}, delay {data['delay']} output steps"
                  f" (pulses: multiples of {data['pulse_multiple']})")  # fmt: skip
    axes = ", ".join(f"{n} axis {a}" for n, a in data["input_axes"].items())
    table.add_row(
        "streaming axes", f"{axes} → " + ", ".join(f"{n} axis {a}" for n, a in data["output_axes"].items())
    )
    for p in data["points"]:
        for e in p["outputs"]:
            mark = "✓" if e["ok"] else "✗"
            table.add_row(
                f"streamed {p['label']}",
                f"{e['name']}: max abs {short(e['max_abs'])} (tolerance {short(e['tolerance'])}),"
                f" {p['chunks']} chunks  {mark}",
            )
    if data["chunk_ms"]["mean"] is not None:
        table.add_row(
            "chunk time", f"mean {data['chunk_ms']['mean']:.3f} ms, max {data['chunk_ms']['max']:.3f} ms"
        )


def check(args: argparse.Namespace, out: Output) -> int:
    """``torchlower check ARCHIVE --stream T=32 --model MODULE:FACTORY``."""
    import torchlower
    from torchlower.artifact.stream_verify import verify_stream
    from torchlower.cli.factory import build_model

    if not args.model:
        raise usage_error("--stream checks the pulsed archive against a model: give --model MODULE:FACTORY")
    target = Path(args.archive)
    inputs = specs.read_npz(args.inputs, "--inputs") if args.inputs else None
    model = build_model(args.model, args.weights, args.trust).eval()
    with show_progress(out):
        graph = torchlower.load(target).graph
        report = verify_stream(
            target, graph, model, pulses(args.stream), inputs, args.tolerance, args.seed or 0
        )
    data = {"ok": True, "path": str(target), "stream": report_json(report)}

    def render(console: Console) -> None:
        table = Table(title=f"streamed {target} in tract", show_header=False, title_justify="left")
        table.add_column("item", style="bold")
        table.add_column("value")
        render_report(table, data["stream"])
        console.print(table)
        console.print("[green]ok[/green]: the stream matches the model on the whole input")

    out.emit(data, render)
    return 0


def run(args: argparse.Namespace, out: Output) -> int:
    """``torchlower run ARCHIVE --stream T=32 [--inputs in.npz] [--out out.npz] [--rate HZ]``."""
    import torchlower
    from torchlower.artifact import io

    target = Path(args.archive)
    if args.rate <= 0:
        raise usage_error("--rate must be > 0 (steps of the streaming axis per second)")
    with show_progress(out):
        art = torchlower.load(target)
        given = specs.read_npz(args.inputs, "--inputs") if args.inputs else None
        if given is None:
            given = io.inputs_for(art, None, specs.symbol_sizes(args.symbol), args.seed)
        with art.stream(pulses(args.stream), threads=args.threads) as stream:
            result = stream.run(given)
            delay, pulse, axes = stream.delay, stream.pulse, stream.output_axes
    if args.out:
        np.savez(args.out, **result.outputs)
    seconds = result.chunk_seconds
    data: dict[str, Any] = {
        "ok": True,
        "path": str(target),
        "pulse": pulse,
        "delay": delay,
        "steps": result.steps,
        "chunks": result.chunks,
        "output_axes": axes,
        "outputs": [
            {"name": n, "shape": list(a.shape), "dtype": str(a.dtype)} for n, a in result.outputs.items()
        ],
        "rate": args.rate,
        "real_time_factor": result.real_time_factor(args.rate),
        "chunk_ms": {"mean": 1000 * sum(seconds) / len(seconds), "max": 1000 * max(seconds)}
        if seconds
        else None,
        "saved": args.out,
    }

    def render(console: Console) -> None:
        table = Table(title=f"streamed {target} in tract", show_header=False, title_justify="left")
        table.add_column("item", style="bold")
        table.add_column("value")
        table.add_row("pulse", f"{pulse} steps, {result.chunks} chunks for {result.steps} input steps")
        table.add_row("delay", f"{delay} output steps (dropped: outputs are aligned with the input)")
        for o in data["outputs"]:
            table.add_row(f"output {o['name']}", f"{o['shape']} {o['dtype']}")
        if data["chunk_ms"]:
            table.add_row(
                "chunk time", f"mean {data['chunk_ms']['mean']:.3f} ms, max {data['chunk_ms']['max']:.3f} ms"
            )
        table.add_row("real-time factor", f"{data['real_time_factor']:.4f} at {args.rate:g} steps/s")
        console.print(table)
        if args.out:
            console.print(f"outputs saved to {args.out}")

    out.emit(data, render)
    return 0

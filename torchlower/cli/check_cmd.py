"""``torchlower check ARCHIVE [--inputs in.npz] [--expected out.npz | --model MODULE:FACTORY]``"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from torchlower.cli import lattice_cmd, specs, stream_cmd
from torchlower.cli.console import Output, show_progress
from torchlower.cli.export_cmd import points_json, quality_error, render_checks
from torchlower.cli.factory import build_model
from torchlower.cli.failures import output_error, short, usage_error


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "check",
        parents=[common],
        help="run an artifact in tract and compare with expected outputs or a model",
        description="Run ARCHIVE (NNEF archive or lattice folder) and compare per output. Without"
        " --inputs, random inputs are drawn from the declared shapes.",
    )
    p.add_argument("archive", metavar="ARCHIVE")
    p.add_argument("--inputs", metavar="IN.npz", help="inputs by name (or positional arr_0, arr_1, …)")
    ref = p.add_mutually_exclusive_group()
    ref.add_argument("--expected", metavar="OUT.npz", help="expected outputs by name (or positional)")
    ref.add_argument("--model", metavar="MODULE:FACTORY", help="PyTorch model giving the expected outputs")
    p.add_argument("--weights", help="state dict for --model")
    p.add_argument("--trust", action="store_true", help="allow --weights files that need full unpickling")
    p.add_argument("--tolerance", type=float, help="max abs error allowed (default 1e-4 × output scale)")
    p.add_argument("--symbol", action="append", default=[], metavar="SYM=SIZE", help="size of a symbolic dim")
    p.add_argument("--seed", type=int, help="seed of random inputs (default 0)")
    p.add_argument("--save-outputs", metavar="OUT.npz", help="write tract's outputs (by name) to a .npz")
    stream_cmd.add_option(p, "check tract's pulsed model at this pulse (e.g. T=32) against --model")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, out: Output) -> int:
    target = Path(args.archive)
    if not target.exists():
        raise usage_error(f"artifact {args.archive!r} does not exist")
    if lattice_cmd.is_lattice(target):
        return lattice_cmd.check(args, out)
    if args.stream:
        return stream_cmd.check(args, out)
    from torchlower.artifact import bundled

    parts = bundled.parts_of(target)
    if parts is not None:  # a multi-archive LLM export: every part, each against its own samples
        if args.inputs or args.expected or args.model or args.save_outputs:
            raise usage_error(
                f"{target} is a folder of {len(parts)} archives: --inputs, --expected, --model and"
                " --save-outputs apply to one graph",
                f"give one of them, e.g. `torchlower check {next(iter(parts.values()))} --inputs IN.npz`.",
            )
        checked = {name: _check_one(part, args, out) for name, part in parts.items()}
        data = {"ok": True, "path": str(target), "format": "parts", "parts": checked}
        out.emit(data, lambda console: render_parts(console, data))
        return 0
    data = _check_one(target, args, out)
    out.emit(data, lambda console: render(console, data))
    return 0


def _check_one(target: Path, args: argparse.Namespace, out: Output) -> dict[str, Any]:
    """``torchlower.check`` of one graph with the command's options, as the JSON the CLI prints."""
    import torchlower

    inputs = specs.read_npz(args.inputs, "--inputs") if args.inputs else None
    expected = specs.read_npz(args.expected, "--expected") if args.expected else None
    if (args.weights or args.trust) and not args.model:
        raise usage_error("--weights and --trust need --model MODULE:FACTORY")
    if args.tolerance is not None and not (args.model or args.expected):
        raise usage_error("--tolerance needs something to compare with: --expected OUT.npz or --model")
    if args.inputs and (args.symbol or args.seed is not None):
        raise usage_error(
            "--symbol and --seed shape and draw random inputs; with --inputs they have no effect"
        )
    model = build_model(args.model, args.weights, args.trust).eval() if args.model else None
    sizes = specs.symbol_sizes(args.symbol)
    with show_progress(out):
        result = torchlower.check(
            target, inputs, expected, model, args.tolerance, symbol_sizes=sizes, seed=args.seed or 0
        )
    names = _output_names(target, len(result.outputs))
    if args.save_outputs:
        np.savez(args.save_outputs, **dict(zip(names, result.outputs, strict=True)))
    return {
        "ok": True,
        "path": str(target),
        "inputs": [
            _array_json(n, a) for n, a in zip(_input_names(target, result.inputs), result.inputs, strict=True)
        ],
        "outputs": [_array_json(n, a) for n, a in zip(names, result.outputs, strict=True)],
        "reference": _reference(model, expected, result),
        "random_inputs": inputs is None,
        "compared": [output_error(e) for e in result.errors],
        "max_abs_error": result.max_abs_error if result.errors else None,
        "comparison": getattr(result, "comparison", None),
        "points": points_json(getattr(result, "points", [])),
        "errors": [output_error(e) for e in result.errors],
        "original_errors": [quality_error(e) for e in getattr(result, "original_errors", [])],
    }


def _reference(model: Any, expected: Any, result: Any) -> str | None:
    """What the outputs were compared with: the model, the expected arrays, the bundled samples."""
    if model is not None:
        return "model"
    if expected is not None:
        return "expected"
    return "bundled samples" if result.errors else None


def _output_names(target: Path, count: int) -> list[str]:
    try:
        import torchlower

        names = [o["name"] for o in torchlower.inspect(target, tract=False)["outputs"]]
    except Exception:  # lattice summaries may name outputs differently
        names = []
    return names if len(names) == count else [f"output_{i}" for i in range(count)]


def _input_names(target: Path, arrays: list[Any]) -> list[str]:
    try:
        import torchlower

        names = [i["name"] for i in torchlower.inspect(target, tract=False)["inputs"]]
    except Exception:
        names = []
    return names if len(names) == len(arrays) else [f"input_{i}" for i in range(len(arrays))]


def _array_json(name: str, a: Any) -> dict[str, Any]:
    a = np.asarray(a)
    return {"name": name, "shape": list(a.shape), "dtype": str(a.dtype)}


def render_parts(console: Console, data: dict[str, Any]) -> None:
    console.print(f"{data['path']}: {len(data['parts'])} archives, each checked")
    for part in data["parts"].values():
        render(console, part)


def render(console: Console, data: dict[str, Any]) -> None:
    table = Table(title=f"checked {data['path']} in tract", title_justify="left")
    for col in ("tensor", "shape", "dtype", "max abs error", "max rel error", "tolerance", ""):
        table.add_column(col)
    for t in data["inputs"]:
        table.add_row(
            f"in  {t['name']}",
            str(t["shape"]),
            t["dtype"],
            "",
            "",
            "",
            "random" if data["random_inputs"] else "",
        )
    errors = {e["name"]: e for e in data["compared"]}
    for t in data["outputs"]:
        e = errors.get(t["name"])
        cells = (
            [short(e["max_abs"]), short(e["max_rel"]), short(e["tolerance"]), "✓" if e["ok"] else "✗"]
            if e
            else ["", "", "", ""]
        )
        table.add_row(f"out {t['name']}", str(t["shape"]), t["dtype"], *cells)
    console.print(table)
    if data["points"]:
        checks = Table(
            title=f"compared with the {data['comparison']}", title_justify="left", show_header=False
        )
        checks.add_column("item", style="bold")
        checks.add_column("value")
        render_checks(checks, data)
        console.print(checks)
    if data["reference"] is None:
        console.print(
            "ran in tract; nothing to compare with (give --expected OUT.npz or --model MODULE:FACTORY)"
        )
    else:
        console.print(f"[green]ok[/green]: every output matches the {data['reference']} within tolerance")

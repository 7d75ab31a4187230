"""``torchlower export MODULE:FACTORY -o OUT --input x:1x3x224x224 …``"""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from torchlower.cli import specs
from torchlower.cli.console import Output, show_progress
from torchlower.cli.factory import build_model
from torchlower.cli.failures import output_error, short, usage_error

# CLI option -> keyword of torchlower.export, for options that arrive with later releases
_PLANNED = {"dynamic": "dynamic_axes", "precision": "precision", "compress": "compress"}


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "export",
        parents=[common],
        help="export a model to an NNEF archive and check it in tract",
        description="Import MODULE:FACTORY, export the model it returns, run the archive in tract"
        " and compare with PyTorch.",
    )
    p.add_argument("model", metavar="MODULE:FACTORY", help="e.g. mypkg.nets:make_net or nets.py:Net")
    p.add_argument("-o", "--output", required=True, help="archive path (.nnef.tgz, .nnef.tar or .nnef dir)")
    p.add_argument(
        "--input",
        action="append",
        default=[],
        metavar="NAME:DIMS[:DTYPE]",
        help="example input drawn at random, e.g. x:1x3x224x224 or ids:1x16:i64 (repeat, in order)",
    )
    p.add_argument("--inputs", metavar="IN.npz", help="example inputs from a .npz instead of --input")
    p.add_argument("--output-name", action="append", default=[], metavar="NAME", help="name outputs")
    p.add_argument(
        "--weights", help="state dict to load (.pt/.pth via torch.load(weights_only=True), .safetensors)"
    )
    p.add_argument("--trust", action="store_true", help="allow --weights files that need full unpickling")
    p.add_argument("--frontend", default="auto", choices=["auto", "jit", "fx", "export"])
    p.add_argument(
        "--dynamic",
        action="append",
        default=[],
        metavar="INPUT:AXIS=SYMBOL[MIN..MAX]",
        help="e.g. x:0=B, or bounded x:1=S[2..128] (docs/dynamic-axes.md)",
    )
    p.add_argument("--precision", choices=["f32", "f16"], help="weight and compute precision")
    p.add_argument("--compress", choices=["q4_0"], help="weight compression")
    p.add_argument("--no-check", action="store_true", help="write without running tract")
    p.add_argument("--tolerance", type=float, help="max abs error allowed by the check")
    p.add_argument("--seed", type=int, help="seed of the random example inputs (default 0)")
    p.add_argument("--stream", metavar="SYM=PULSE", help="also verify tract's pulsed model (e.g. T=16)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, out: Output) -> int:
    import torchlower

    if args.trust and not args.weights:
        raise usage_error("--trust allows unpickling a --weights file; it needs --weights")
    if args.no_check and args.tolerance is not None:
        raise usage_error("--tolerance is used by the check, which --no-check turns off: drop one")
    accepted = inspect.signature(torchlower.export).parameters
    options = _planned_options(args, accepted)
    names, tensors = _examples(args)
    if args.dynamic:
        options["dynamic_axes"] = specs.dynamic_axes(args.dynamic, names)
    if args.stream:
        from torchlower.cli.stream_cmd import pulses

        options["stream"] = pulses(args.stream)
    if args.frontend != "auto" or accepted["frontend"].default == "auto":
        options["frontend"] = args.frontend
    model = build_model(args.model, args.weights, args.trust).eval()  # ours: the CLI built it
    _try_forward(model, args.model, names, tensors)
    with show_progress(out):
        report = torchlower.export(
            model,
            tuple(tensors),
            args.output,
            input_names=names,
            output_names=args.output_name or None,
            check=not args.no_check,
            tolerance=args.tolerance,
            **options,
        )
    data = report_json(report)
    out.emit(data, lambda console: render(console, data))
    return 0


def _try_forward(model: Any, spec: str, names: list[str], tensors: list[Any]) -> None:
    """Run the model once so a shape or dtype mismatch is reported as bad input, naming both."""
    import torch

    try:
        with torch.no_grad():
            model(*tensors)
    except Exception as exc:
        given = ", ".join(
            f"{n} {list(t.shape)} {str(t.dtype).removeprefix('torch.')}"
            for n, t in zip(names, tensors, strict=True)
        )
        first = (str(exc).strip().splitlines() or [""])[0]
        raise usage_error(
            f"{spec} failed on the example inputs ({given}): {type(exc).__name__}: {first}",
            "give --input shapes and dtypes that the model's forward accepts, in its argument order.",
        ) from exc


def _planned_options(args: argparse.Namespace, accepted: Any) -> dict[str, Any]:
    """Values of options ``torchlower.export`` takes; a clear refusal for those it does not yet."""
    options: dict[str, Any] = {}
    for option, keyword in _PLANNED.items():
        value = getattr(args, option)
        if not value:
            continue
        if keyword not in accepted:
            raise usage_error(
                f"--{option} is not supported yet: this torchlower's export() has no {keyword}= argument",
                "dynamic axes, f16 precision and Q4_0 compression are planned (docs/dynamic-axes.md,"
                " docs/compression.md); export without the option for now.",
            )
        if option != "dynamic":
            options[keyword] = value
    return options


def _examples(args: argparse.Namespace) -> tuple[list[str], list[Any]]:
    import torch

    if args.inputs and args.input:
        raise usage_error("give either --input specs or --inputs IN.npz, not both")
    if args.inputs and args.seed is not None:
        raise usage_error("--seed draws random --input examples; with --inputs IN.npz it has no effect")
    if args.inputs:
        arrays = specs.read_npz(args.inputs, "--inputs")
        if isinstance(arrays, dict):
            return list(arrays), [torch.from_numpy(a.copy()) for a in arrays.values()]
        return [f"input_{i}" for i in range(len(arrays))], [torch.from_numpy(a.copy()) for a in arrays]
    if not args.input:
        raise usage_error(
            "no example inputs: give --input NAME:DIMS[:DTYPE] for each model input",
            "e.g. --input x:1x3x224x224 (or --inputs in.npz with real data).",
        )
    parsed = [specs.input_spec(s) for s in args.input]
    names = [s.name for s in parsed]
    if len(set(names)) != len(names):
        raise usage_error(f"--input names must differ; got {', '.join(names)}")
    return names, specs.example_tensors(parsed, args.seed or 0)


def report_json(report: Any) -> dict[str, Any]:
    path = Path(report.path)
    size = path.stat().st_size if path.is_file() else sum(f.stat().st_size for f in path.rglob("*"))
    return {
        "ok": True,
        "path": str(path),
        "frontend": report.frontend,
        "inputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in report.inputs],
        "outputs": [{"name": t.name, "shape": list(t.shape), "dtype": t.dtype} for t in report.outputs],
        "ops": dict(sorted(report.op_histogram.items(), key=lambda kv: (-kv[1], kv[0]))),
        "weight_bytes": report.weight_bytes,
        "artifact_bytes": size,
        "checked": report.checked,
        "max_abs_error": report.max_abs_error if report.checked else None,
        "outputs_checked": [output_error(e) for e in report.errors],
        "comparison": _comparison(report),
        "points": points_json(report.points),
        "errors": [output_error(e) for e in report.errors],
        "original_errors": [quality_error(e) for e in report.original_errors],
        "notes": list(report.notes),
        "stream": _stream_json(report),
    }


def _stream_json(report: Any) -> dict[str, Any] | None:
    if getattr(report, "stream", None) is None:
        return None
    from torchlower.cli.stream_cmd import report_json as stream_json

    return stream_json(report.stream)


def _comparison(report: Any) -> str | None:
    if not report.checked:
        return None
    if report.compress:
        return (
            f"model with the dequantized {report.compress} weights (exactness; the quality loss"
            " against the original model is in original_errors)"
        )
    return "model"


def points_json(points: list[Any]) -> list[dict[str, Any]]:
    """Every input set checked: label, input shapes, per-output errors, or why it was skipped."""
    return [
        {
            "label": p.label,
            "inputs": [list(s) for s in p.inputs],
            "skipped": p.skipped,
            "outputs": [output_error(e) for e in p.errors],
        }
        for p in points
    ]


def quality_error(e: Any) -> dict[str, Any]:
    """An error against the original model (informative: no tolerance, never failing)."""
    data = output_error(e)
    return {"name": data["name"], "max_abs": data["max_abs"], "max_rel": data["max_rel"]}


def render_checks(table: Table, data: dict[str, Any]) -> None:
    """One row per output per input set, ✓ / ✗ against its tolerance; skipped sets say why."""
    for point in data["points"]:
        if point["skipped"]:
            table.add_row(f"check {point['label']}", f"skipped: {point['skipped']}")
            continue
        for e in point["outputs"]:
            mark = "✓" if e["ok"] else "✗"
            table.add_row(
                f"check {e['name']}",
                f"max abs {short(e['max_abs'])}, rel {short(e['max_rel'])}"
                f" (tolerance {short(e['tolerance'])})  {mark}" + (f"  {e['note']}" if e.get("note") else ""),
            )
    for e in data["original_errors"]:
        table.add_row(
            f"vs original {e['name']}",
            f"max abs {short(e['max_abs'])}, rel {short(e['max_rel'])}  (quality loss)",
        )


def render(console: Console, data: dict[str, Any]) -> None:
    table = Table(title=f"exported {data['path']}", show_header=False, title_justify="left")
    table.add_column("item", style="bold")
    table.add_column("value")
    for kind in ("inputs", "outputs"):
        for t in data[kind]:
            table.add_row(f"{kind[:-1]} {t['name']}", f"{t['shape']} {t['dtype']}")
    table.add_row("front end", data["frontend"])
    table.add_row("ops", ", ".join(f"{op}×{n}" for op, n in data["ops"].items()))
    table.add_row("weights", f"{data['weight_bytes']:,} bytes")
    table.add_row("artifact", f"{data['artifact_bytes']:,} bytes")
    if data["checked"]:
        table.add_row("compared with", data["comparison"])
    render_checks(table, data)
    if data.get("stream"):
        from torchlower.cli.stream_cmd import render_report

        render_report(table, data["stream"])
    for note in data["notes"]:
        table.add_row("note", note)
    console.print(table)
    if not data["checked"]:
        console.print("not checked (--no-check); run `torchlower check` on it later")

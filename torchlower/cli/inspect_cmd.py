"""``torchlower inspect ARCHIVE [--svg f | --png f | --dot f] [--json]``"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from torchlower.cli import lattice_cmd
from torchlower.cli.console import Output
from torchlower.cli.failures import usage_error


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "inspect",
        parents=[common],
        help="summarize an artifact; draw its graph",
        description="Inputs, outputs, symbols, op histogram, weight bytes by dtype and format,"
        " extensions. --svg/--png draw the graph with Graphviz (nodes coloured by op family,"
        " edges labelled with tensor shapes).",
    )
    p.add_argument("archive", metavar="ARCHIVE")
    pic = p.add_mutually_exclusive_group()
    pic.add_argument("--svg", metavar="FILE", help="write the graph picture as SVG")
    pic.add_argument("--png", metavar="FILE", help="write the graph picture as PNG")
    pic.add_argument("--dot", metavar="FILE", help="write the Graphviz source (no Graphviz needed)")
    p.add_argument("--no-shapes", action="store_true", help="do not run tract to learn intermediate shapes")
    p.set_defaults(run=run)


def run(args: argparse.Namespace, out: Output) -> int:
    import torchlower

    target = Path(args.archive)
    if not target.exists():
        raise usage_error(f"artifact {args.archive!r} does not exist")
    if lattice_cmd.is_lattice(target):
        return lattice_cmd.inspect(args, out)
    data = dict(torchlower.inspect(target))
    picture = args.svg or args.png or args.dot
    if picture:
        if data.get("format") != "nnef":
            raise usage_error(
                f"{target}: pictures are drawn for NNEF artifacts; this is a {data.get('format', 'lattice')}"
                " artifact",
                "use `torchlower inspect` without --svg/--png for its summary.",
            )
        from torchlower.cli import graph_picture

        fmt = "svg" if args.svg else "png" if args.png else "dot"
        drawn = graph_picture.draw(target, Path(picture), fmt, shapes=not args.no_shapes)
        data["picture"] = {"path": picture, "format": fmt, "nodes": drawn.nodes, "edges": drawn.edges}
    data = {"ok": True, **data}
    out.emit(data, lambda console: render(console, data))
    return 0


def render(console: Console, data: dict[str, Any]) -> None:
    if data.get("format") != "nnef":
        _render_generic(console, data)
        return
    t = Table(title=f"{data['path']} ({data['container']})", show_header=False, title_justify="left")
    t.add_column("item", style="bold")
    t.add_column("value")
    for i in data["inputs"]:
        t.add_row(f"input {i['name']}", f"{i['shape']} {i['dtype']}")
    for o in data["outputs"]:
        t.add_row(f"output {o['name']}", "")
    t.add_row("symbols", ", ".join(data["symbols"]) or "none")
    t.add_row("extensions", ", ".join(data["extensions"]) or "none")
    w = data["weights"]
    t.add_row("weights", f"{w['count']} tensors, {w['bytes']:,} bytes")
    for dtype, n in w["bytes_by_dtype"].items():
        t.add_row(f"  as {dtype}", f"{n:,} bytes")
    for fmt, n in w["bytes_by_format"].items():
        t.add_row(f"  stored {fmt}", f"{n:,} bytes")
    if w["unused_files"]:
        t.add_row("unused files", ", ".join(w["unused_files"]))
    t.add_row("ops", f"{data['op_count']} assignments")
    for op, n in data["ops"].items():
        t.add_row(f"  {op}", str(n))
    if "picture" in data:
        p = data["picture"]
        t.add_row("picture", f"{p['path']} ({p['nodes']} nodes, {p['edges']} edges)")
    console.print(t)


def _render_generic(console: Console, data: dict[str, Any]) -> None:
    """Lattice summaries (or any other kind) as key: value lines."""
    t = Table(title=str(data.get("path", "artifact")), show_header=False, title_justify="left")
    t.add_column("item", style="bold")
    t.add_column("value")
    for key, value in data.items():
        if key not in ("ok", "path"):
            t.add_row(str(key), str(value))
    console.print(t)

"""``torchlower inspect ARCHIVE [--svg f | --png f | --dot f] [--json]``"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from torchlower.cli import lattice_cmd
from torchlower.cli.console import Output, show_progress
from torchlower.cli.failures import usage_error


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "inspect",
        parents=[common],
        help="summarize an artifact; draw its graph",
        description="Inputs, outputs, symbols, op histogram, weight bytes by dtype and format,"
        " extensions, and every output's shape and dtype as tract derives them (symbolic for"
        " dynamic graphs). --svg/--png draw the graph (nodes grouped by module, coloured by op"
        " family, edges labelled with tensor shapes); --graph prints graph.nnef.",
    )
    p.add_argument("archive", metavar="ARCHIVE")
    pic = p.add_mutually_exclusive_group()
    pic.add_argument("--svg", metavar="FILE", help="write the graph picture as SVG")
    pic.add_argument("--png", metavar="FILE", help="write the graph picture as PNG")
    pic.add_argument("--dot", metavar="FILE", help="write the Graphviz source (no Graphviz needed)")
    pic.add_argument("--graph", action="store_true", help="print graph.nnef (paged on a terminal)")
    p.add_argument(
        "--detail",
        choices=("blocks", "ops"),
        default="blocks",
        help="pictures: collapse each sub-module into one node (blocks, default) or draw every op",
    )
    p.add_argument(
        "--no-shapes", action="store_true", help="do not load the graph in tract for output / edge shapes"
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace, out: Output) -> int:

    target = Path(args.archive)
    if not target.exists():
        raise usage_error(f"artifact {args.archive!r} does not exist")
    if lattice_cmd.is_lattice(target):
        return lattice_cmd.inspect(args, out)
    if args.graph:
        return _print_graph(target, out)
    with show_progress(out):
        data = dict(_summary(target, shapes=not args.no_shapes))
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
        with show_progress(out):
            drawn = graph_picture.draw(target, Path(picture), fmt, not args.no_shapes, args.detail)
        data["picture"] = {
            "path": picture,
            "format": fmt,
            "detail": args.detail,
            "nodes": drawn.nodes,
            "edges": drawn.edges,
            "clusters": drawn.clusters,
            "renderer": drawn.renderer,
        }
    data = {"ok": True, **data}
    out.emit(data, lambda console: render(console, data))
    return 0


def _summary(target: Path, shapes: bool) -> dict[str, Any]:
    import torchlower

    if (target / "graph.mlir").exists():  # lattice folders have their own summary
        return dict(torchlower.inspect(target))
    return dict(torchlower.inspect(target, tract=shapes))


def _print_graph(target: Path, out: Output) -> int:
    """``graph.nnef`` as checked by the reader; through a pager only when stdout is a terminal."""
    from torchlower.artifact import io

    with show_progress(out):
        text = io.graph_text(target)
    if out.json:
        out.emit({"ok": True, "path": str(target), "graph": text}, lambda _c: None)
        return 0
    if not out.quiet:
        console = out.stdout
        if console.is_terminal and text.count("\n") > console.height:
            with console.pager():
                console.print(text, markup=False, highlight=False, end="")
        else:
            sys.stdout.write(text)
    return 0


def render(console: Console, data: dict[str, Any]) -> None:
    if data.get("format") == "parts":  # a folder of archives (an encoder-decoder export)
        _render_manifest(console, data)
        for part in data["parts"].values():
            render(console, part)
        return
    if data.get("format") != "nnef":
        _render_generic(console, data)
        return
    t = Table(title=f"{data['path']} ({data['container']})", show_header=False, title_justify="left")
    t.add_column("item", style="bold")
    t.add_column("value")
    for i in data["inputs"]:
        t.add_row(f"input {i['name']}", f"{i['shape']} {i['dtype']}")
    for o in data["outputs"]:
        shape = "unknown shape" if o.get("shape") is None else str(o["shape"])
        t.add_row(f"output {o['name']}", f"{shape} {o.get('dtype') or ''}".strip())
    t.add_row("symbols", ", ".join(data["symbols"]) or "none")
    t.add_row("extensions", ", ".join(data["extensions"]) or "none")
    s = data.get("streaming")
    if s:
        axes = ", ".join(f"{n} axis {a}" for n, a in s["inputs"].items())
        outs = ", ".join(f"{n} axis {a} (delay {d})" for n, (a, d) in s["outputs"].items())
        t.add_row("streaming", f"over {s['symbol']}: {axes} → {outs}; verified at pulse {s['pulse']}"
                  f" (pulses: multiples of {s['multiple']})")  # fmt: skip
    w = data["weights"]
    t.add_row("weights", f"{w['count']} tensors, {w['bytes']:,} bytes")
    for dtype, n in w["bytes_by_dtype"].items():
        t.add_row(f"  as {dtype}", f"{n:,} bytes")
    for fmt, n in w["bytes_by_format"].items():
        t.add_row(f"  stored {fmt}", f"{n:,} bytes")
    if w["unused_files"]:
        t.add_row("unused files", ", ".join(w["unused_files"]))
    _render_bundled(t, data.get("bundled") or {})
    modules = data.get("modules") or {}
    if modules:
        tops: Counter[str] = Counter()
        for m, n in modules.items():
            parts = m.split(".")
            tops[".".join(parts[:2] if len(parts) > 1 and parts[1].isdigit() else parts[:1])] += n
        listing = ", ".join(f"{m} ({n})" for m, n in list(tops.items())[:8])
        t.add_row("modules", f"{len(modules)} ({listing}{', …' if len(tops) > 8 else ''})")
    t.add_row("ops", f"{data['op_count']} assignments")
    for op, n in data["ops"].items():
        t.add_row(f"  {op}", str(n))
    if "picture" in data:
        p = data["picture"]
        t.add_row(
            "picture",
            f"{p['path']} ({p['nodes']} nodes, {p['edges']} edges, {p['clusters']} clusters;"
            f" drawn by {p['renderer']})",
        )
    console.print(t)


_MANIFEST_KEYS = ("model_type", "architecture", "max_context", "vocab_size", "hidden_size", "precision",
                  "compress", "decoder_start_token_id", "eos_token_id")  # fmt: skip


def _render_manifest(console: Console, data: dict[str, Any]) -> None:
    """How the archives of a multi-graph export connect: the manifest's identity, each part's
    inputs, the media placeholder and the encoder's frames."""
    manifest = data["manifest"]
    t = Table(
        title=f"{data['path']}: {len(data['parts'])} archives ({manifest.get('format')})",
        show_header=False, title_justify="left",
    )  # fmt: skip
    t.add_column("item", style="bold")
    t.add_column("value")
    for key in _MANIFEST_KEYS:
        if manifest.get(key) is not None:
            t.add_row(f"manifest {key}", str(manifest[key]))
    for name in data["parts"]:
        entry = manifest.get(name, {})
        t.add_row(f"part {name}", f"{entry.get('archive')}; inputs {entry.get('inputs')}")
    media = manifest.get("media")
    if media:
        t.add_row("media", f"{media.get('input')} → {media.get('tokens_per_item')} rows per item at token"
                  f" {media.get('token_id')} ({media.get('part')})")  # fmt: skip
    frames = (manifest.get("encoder") or {}).get("frames")
    if frames:
        t.add_row("encoder frames", f"axis {frames['axis']}: {frames['min']}..{frames['max']}")
    for key in ("positions", "attention"):
        if manifest.get(key):
            t.add_row(key, str(manifest[key].get("kind")))
    console.print(t)


def _render_bundled(t: Table, bundle: dict[str, Any]) -> None:
    """Files bundled beside the graph, the config's identity, the samples' arrays, properties."""
    for f in bundle.get("files", []):
        t.add_row(f"bundled {f['name']}", f"{f['kind']}, {f['bytes']:,} bytes")
    for key, value in (bundle.get("config") or {}).items():
        t.add_row(f"  config {key}", str(value))
    for name, arrays in (bundle.get("samples") or {}).items():
        shapes = ", ".join(f"{k} {a['shape']}" for k, a in arrays.items())
        t.add_row(f"  sample {name}", shapes)
    for key, value in (bundle.get("properties") or {}).items():
        t.add_row(f"property {key}", str(value))


def _render_generic(console: Console, data: dict[str, Any]) -> None:
    """Lattice summaries (or any other kind) as key: value lines."""
    t = Table(title=str(data.get("path", "artifact")), show_header=False, title_justify="left")
    t.add_column("item", style="bold")
    t.add_column("value")
    for key, value in data.items():
        if key not in ("ok", "path"):
            t.add_row(str(key), str(value))
    console.print(t)

"""``torchlower inspect`` / ``check`` on a lattice folder (``graph.mlir`` + ``weights.safetensors``).

``inspect_cmd`` and ``check_cmd`` hand a folder holding ``graph.mlir`` to this module, so the
NNEF commands and the lattice ones share their options but not their code.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from torchlower.cli import specs
from torchlower.cli.console import Output
from torchlower.cli.factory import build_model
from torchlower.cli.failures import output_error, short, usage_error
from torchlower.cli.graph_picture import write_picture
from torchlower.cli.picture_model import Edge, Node, Picture


def is_lattice(target: Path) -> bool:
    return target.is_dir() and (target / "graph.mlir").exists()


# ---- inspect ----------------------------------------------------------------------------------
def inspect(args: argparse.Namespace, out: Output) -> int:
    from torchlower.lattice import io

    target = Path(args.archive)
    data: dict[str, Any] = {"ok": True, **io.inspect(target)}
    picture = args.svg or args.png or args.dot
    if picture:
        fmt = "svg" if args.svg else "png" if args.png else "dot"
        nodes, edges = draw(io.load(target), Path(picture), fmt)
        data["picture"] = {"path": picture, "format": fmt, "nodes": nodes, "edges": edges}
    out.emit(data, lambda console: render_inspect(console, data))
    return 0


def render_inspect(console: Console, data: dict[str, Any]) -> None:
    t = Table(
        title=f"{data['path']} (lattice IR v{data['ir_version']})", show_header=False, title_justify="left"
    )
    t.add_column("item", style="bold")
    t.add_column("value")
    for i in data["inputs"]:
        t.add_row(f"input {i['name']}", f"{i['type']}  role {i['role']}")
    for o in data["outputs"]:
        t.add_row(f"output {o['name']}", f"{o['type']}  role {o['role']}")
    w = data["weights"]
    t.add_row("weights", f"{w['count']} weights in {w['tensors']} tensors, {w['bytes']:,} bytes")
    for packing, n in w["bytes_by_packing"].items():
        t.add_row(f"  {packing}", f"{n:,} bytes")
    t.add_row("ops", f"{data['op_count']} ops")
    for op, n in data["ops"].items():
        t.add_row(f"  {op}", str(n))
    t.add_row("schema digest", str(data["schema_digest"]))
    t.add_row("sha256", data["sha256"])
    if "picture" in data:
        p = data["picture"]
        t.add_row("picture", f"{p['path']} ({p['nodes']} nodes, {p['edges']} edges)")
    console.print(t)


def family(op: str) -> str:
    """The op family of the NNEF pictures (same colours): a sparse net reads like a dense one."""
    if op == "weight":
        return "weight"
    if "conv" in op or op in ("linear", "embedding_lookup"):
        return "linear"
    if "pool" in op or op == "trilinear_upsample3d":
        return "pooling"
    if op.startswith("sparse.") or op in ("voxelize", "devoxelize"):
        return "layout"
    if op in ("activation", "softmax"):
        return "activation"
    if "norm" in op:
        return "normalization"
    return "arithmetic"


def picture(folder: Any) -> Picture:
    """One node per input and op (weights as grey cylinders), one edge per operand use."""
    art = folder.artifact
    producer: dict[str, str] = {}
    nodes: list[Node] = []
    for i, (name, role) in enumerate(zip(art.input_names, art.input_roles, strict=True)):
        producer[name] = f"i{i}"
        nodes.append(Node(f"i{i}", name, role, f"input {name} ({role})", "input", shape="ellipse"))
    outputs = set(art.returns)
    edges: list[Edge] = []
    for i, op in enumerate(art.ops):
        kind = family(op.op)
        results = ", ".join(op.results)
        for src in dict.fromkeys(op.operands):
            if src in producer:
                edges.append(Edge(producer[src], f"n{i}", ""))
        for r in op.results:
            producer[r] = f"n{i}"
        if kind == "weight":
            key = str(op.attrs.get("storage_key", results))
            nodes.append(Node(f"n{i}", key, results, f"weight {key}", kind, shape="cylinder"))
        else:
            tip = f"{op.op} -> {results}"
            nodes.append(
                Node(f"n{i}", op.op, results, tip, kind, output=bool(outputs.intersection(op.results)))
            )
    return Picture(nodes, edges)


def draw(folder: Any, target: Path, fmt: str) -> tuple[int, int]:
    pic = picture(folder)
    write_picture(pic, target, fmt)
    return len(pic.nodes), len(pic.edges)


# ---- check ------------------------------------------------------------------------------------
def check(args: argparse.Namespace, out: Output) -> int:
    from torchlower.lattice import io

    target = Path(args.archive)
    if (args.weights or args.trust) and not args.model:
        raise usage_error("--weights and --trust need --model MODULE:FACTORY")
    inputs = specs.read_npz(args.inputs, "--inputs") if args.inputs else None
    expected = specs.read_npz(args.expected, "--expected") if args.expected else None
    model = build_model(args.model, args.weights, args.trust).eval() if args.model else None
    result = io.check(target, inputs, expected, model, args.tolerance, seed=args.seed or 0)
    summary = io.inspect(target)
    if args.save_outputs:
        arrays: dict[str, np.ndarray] = {}
        for o, a, s in zip(summary["outputs"], result.outputs, result.sparse_outputs or [], strict=False):
            arrays[o["name"]] = a
            if s is not None:
                arrays[f"{o['name']}_coords"] = s.coords.numpy()
        np.savez(args.save_outputs, **arrays)
    data = {
        "ok": True,
        "path": str(target),
        "format": "lattice",
        "runner": "reference executor",
        "inputs": [
            {"name": i["name"], "role": i["role"], "shape": list(a.shape), "dtype": str(a.dtype)}
            for i, a in zip(summary["inputs"], result.inputs, strict=True)
        ],
        "outputs": [
            {"name": o["name"], "role": o["role"], "shape": list(a.shape), "dtype": str(a.dtype)}
            for o, a in zip(summary["outputs"], result.outputs, strict=True)
        ],
        "reference": "model" if model is not None else "expected" if expected is not None else None,
        "random_inputs": inputs is None,
        "compared": [output_error(e) for e in result.errors],
        "max_abs_error": result.max_abs_error if result.errors else None,
    }
    out.emit(data, lambda console: render_check(console, data))
    return 0


def render_check(console: Console, data: dict[str, Any]) -> None:
    table = Table(title=f"checked {data['path']} in the lattice reference executor", title_justify="left")
    for col in ("tensor", "role", "shape", "dtype", "max abs error", "max rel error", "tolerance", ""):
        table.add_column(col)
    for t in data["inputs"]:
        mark = "random" if data["random_inputs"] else ""
        table.add_row(f"in  {t['name']}", t["role"], str(t["shape"]), t["dtype"], "", "", "", mark)
    errors = {e["name"]: e for e in data["compared"]}
    for t in data["outputs"]:
        e = errors.get(t["name"])
        cells = (
            [short(e["max_abs"]), short(e["max_rel"]), short(e["tolerance"]), "✓" if e["ok"] else "✗"]
            if e
            else ["", "", "", ""]
        )
        shape = f"{t['shape']} (rows sorted)" if t["role"] == "sparse_tensor" else str(t["shape"])
        table.add_row(f"out {t['name']}", t["role"], shape, t["dtype"], *cells)
    console.print(table)
    if data["reference"] is None:
        console.print("ran in the reference executor; nothing to compare with (give --model MODULE:FACTORY)")
    else:
        console.print(f"[green]ok[/green]: every output matches the {data['reference']} within tolerance")

"""The graph as a picture that stays readable for real models.

Nodes are grouped by the module they came from (torchlower writes ``# module: PATH`` comments
into ``graph.nnef``; ``nnef/parse.py`` attaches them to the assignments). A *cluster* is one
indexed block (``layers.0``, ``encoder.layers.3``); with ``detail="blocks"`` (the default) each
sub-module inside it (``layers.0.self_attn``) collapses into one node with its op count, so a
2-layer transformer is two boxes of a handful of nodes, not 150 ops in a column. With
``detail="ops"`` every assignment is a node (weights as grey cylinders), still clustered.

Nodes are coloured by op family (``op_families.py``), labelled with the op (or block) and its
module path, and carry the op's attributes as a tooltip. Edges carry tensor shapes, symbolic
for dynamic graphs (``B×S×64``): tract derives them when it loads a copy of the graph that lists
every tensor as an output (nothing is run). Graphviz draws the picture when ``dot`` is on PATH;
otherwise ``picture_layout.py`` lays it out in Python and ``picture_svg`` / ``picture_png``
draw it, so SVG and PNG need nothing beyond ``pip install torchlower``.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchlower.cli import op_families
from torchlower.cli.failures import usage_error
from torchlower.cli.picture_model import Edge, Node, Picture
from torchlower.errors import TorchlowerError
from torchlower.nnef.graph_model import Expr, Graph, Ident, Invocation

log = logging.getLogger("torchlower")
DETAILS = ("blocks", "ops")


@dataclass(frozen=True)
class Drawn:
    nodes: int
    edges: int
    clusters: int
    renderer: str  # graphviz | python


def draw(artifact: Path, picture: Path, fmt: str, shapes: bool = True, detail: str = "blocks") -> Drawn:
    """Write the picture of ``artifact`` to ``picture`` (``svg``, ``png`` or ``dot`` source)."""
    from torchlower.artifact import io
    from torchlower.core import progress

    if detail not in DETAILS:
        raise usage_error(f"--detail {detail!r}: use one of {', '.join(DETAILS)}")
    art = io.load(artifact)
    known = declared_shapes(art.graph)
    if shapes:
        known.update(probe_shapes(artifact, art.graph))
    pic = build(art.graph, known, detail)
    with progress.stage("drawing"):
        renderer = write_picture(pic, picture, fmt)
    return Drawn(len(pic.nodes), len(pic.edges), len(pic.clusters), renderer)


def write_picture(pic: Picture, picture: Path, fmt: str) -> str:
    """Graphviz when ``dot`` is on PATH, else the Python layout; returns which one drew it."""
    if not picture.parent.is_dir():
        raise usage_error(
            f"cannot write the picture {picture}: the folder {picture.parent} does not exist",
            "create the folder first, or give a path in an existing one.",
        )
    if fmt == "dot":
        picture.write_text(dot_source(pic))
        return "graphviz"
    dot = shutil.which("dot")
    if dot is None:
        write_python_picture(pic, picture, fmt)
        return "python"
    render(dot, dot_source(pic), picture, fmt)
    return "graphviz"


# ---- shapes -------------------------------------------------------------------------------
def declared_shapes(graph: Graph) -> dict[str, str]:
    """Shapes written in the text: inputs (``external``) and weights (``variable``)."""
    from torchlower.core import dtypes

    known = {i.name: f"{dims(i.shape)} {dtypes.name(i.dtype)}" for i in graph.inputs}
    known.update({v.name: dims(v.shape) for v in graph.variables})
    return known


def probe_shapes(artifact: Path, graph: Graph) -> dict[str, str]:
    """Shape of every computed tensor as tract infers it (symbolic for dynamic graphs)."""
    from torchlower.core import progress
    from torchlower.nnef import reader, session
    from torchlower.nnef.text import name_text

    names = [
        n
        for a in graph.assignments
        if a.op not in _SOURCE_OPS
        for n in a.outputs
        if n not in graph.reassigned  # which of the values tract would report is ambiguous
    ]
    names = list(dict.fromkeys(names))
    if not names:
        return {}
    header = re.compile(r"(graph\s+\w+\s*\([^)]*\)\s*->\s*\()([^)]*)(\))")
    try:
        with (
            progress.stage("tract shapes"),
            reader.extracted(artifact) as folder,
            tempfile.TemporaryDirectory() as tmp,
        ):
            copy = Path(tmp, "probe.nnef")
            shutil.copytree(folder, copy)
            text = (folder / "graph.nnef").read_text()
            listed = ", ".join(map(name_text, names))
            (copy / "graph.nnef").write_text(header.sub(lambda m: m[1] + listed + m[3], text, 1))
            facts = session.query_facts(copy)["outputs"]
    except TorchlowerError as exc:
        log.info("intermediate shapes unknown (tract could not load the probe): %s", exc)
        return {}
    if len(facts) != len(names):
        return {}
    return {n: dims(session.parse_fact(f)[0]) for n, f in zip(names, facts, strict=True)}


_SOURCE_OPS = {"external", "tract_core_external", "variable"}


def dims(shape: Any) -> str:
    return "×".join(str(d).replace(" ", "") for d in shape) if len(shape) else "scalar"


# ---- grouping -----------------------------------------------------------------------------
def units(scope: str) -> list[str]:
    """``encoder.layers.0.self_attn`` → ``["encoder", "layers.0", "self_attn"]`` (indices stay
    with their container, so a block is ``layers.0``, never ``0``)."""
    out: list[str] = []
    for part in scope.split(".") if scope else []:
        if part.isdigit() and out:
            out[-1] += f".{part}"
        else:
            out.append(part)
    return out


def cluster_of(scope: str) -> str:
    """The indexed block a scope lies in (``encoder.layers.0``), else its first module if nested."""
    parts = units(scope)
    for i, unit in enumerate(parts):
        if re.search(r"\.\d+$", unit):
            return ".".join(parts[: i + 1])
    return parts[0] if len(parts) >= 2 else ""


def block_of(scope: str) -> str:
    """What collapses into one node: the sub-module one level below the cluster, or the module
    itself outside clusters; ``""`` for ops that sit directly in their cluster or at the top."""
    cluster = cluster_of(scope)
    parts, depth = units(scope), len(units(cluster))
    if cluster and len(parts) > depth:
        return ".".join(parts[: depth + 1])
    if not cluster and parts:
        return parts[0]
    return ""


def build(graph: Graph, shapes: dict[str, str], detail: str = "blocks") -> Picture:
    """Nodes, edges and clusters of the picture (see the module docstring)."""
    outputs = set(graph.outputs)
    node_of: dict[int, Node] = {}  # assignment index -> node
    blocks: dict[str, list[int]] = {}
    for i, a in enumerate(graph.assignments):
        key = block_of(a.scope) if detail == "blocks" and a.op not in _SOURCE_OPS else ""
        if key:
            blocks.setdefault(key, []).append(i)
    weights_of: dict[str, list[str]] = {}
    nodes: list[Node] = []
    block_nodes: dict[str, Node] = {}
    for i, a in enumerate(graph.assignments):
        fam = op_families.family(a.op)
        if detail == "blocks" and fam == "weight":
            continue
        key = block_of(a.scope) if detail == "blocks" and fam != "input" else ""
        if key and len(blocks[key]) > 1:
            if key not in block_nodes:
                members = [graph.assignments[j] for j in blocks[key]]
                block_nodes[key] = _block_node(f"n{i}", key, members, outputs)
                nodes.append(block_nodes[key])
            node_of[i] = block_nodes[key]
            continue
        node = _op_node(f"n{i}", a, fam, shapes, outputs)
        nodes.append(node)
        node_of[i] = node
    producer: dict[str, int] = {}
    edges: dict[tuple[str, str], Edge] = {}
    for i, a in enumerate(graph.assignments):
        for ref in dict.fromkeys(_refs([a.args, list(a.attrs.values())])):
            j = producer.get(ref)
            if j is None or i not in node_of:
                continue
            if j not in node_of:  # a weight folded into its consumer
                weights_of.setdefault(node_of[i].id, []).append(f"{ref} {shapes.get(ref, '')}".strip())
                continue
            src, dst = node_of[j].id, node_of[i].id
            if src != dst and (src, dst) not in edges:
                edges[(src, dst)] = Edge(src, dst, shapes.get(ref, ""))
        for name in a.outputs:
            producer[name] = i
    for node in nodes:
        if node.id in weights_of:
            listed = weights_of[node.id]
            more = f"\n… and {len(listed) - 8} more" if len(listed) > 8 else ""
            node.tooltip += "\nweights: " + "\n  ".join(listed[:8]) + more
    clusters = list(dict.fromkeys(n.cluster for n in nodes if n.cluster))
    return Picture(nodes, list(edges.values()), clusters)


def _op_node(node_id: str, a: Invocation, fam: str, shapes: dict[str, str], outputs: set[str]) -> Node:
    name = ", ".join(a.outputs)
    if fam == "input":
        return Node(node_id, name, shapes.get(name, ""), f"input {name} (line {a.line})", fam, "ellipse")
    if fam == "weight":
        label = str(a.attrs.get("label", name))
        return Node(node_id, label, shapes.get(name, ""), f"{label} (line {a.line})", fam, "cylinder")
    where = a.scope or name
    return Node(
        node_id,
        a.op,
        where,
        _call_text(a),
        fam,
        cluster=cluster_of(a.scope),
        output=bool(outputs.intersection(a.outputs)),
    )


def _block_node(node_id: str, key: str, members: list[Invocation], outputs: set[str]) -> Node:
    ops = Counter(m.op.split("<")[0] for m in members if op_families.family(m.op) != "weight")
    plumbing = ("weight", "layout")
    families = Counter(f for m in members if (f := op_families.family(m.op)) not in plumbing)
    named = op_families.family(units(key)[-1].split(".")[0])  # norm1 → normalization, self_attn → attention
    fam = named if named != "other" else families.most_common(1)[0][0] if families else "module"
    # the ops that say what the block does first; reshapes and casts last
    ranked = sorted(ops.items(), key=lambda kv: (op_families.family(kv[0]) in plumbing, -kv[1]))
    listing = ", ".join(f"{op}×{n}" if n > 1 else op for op, n in ranked)
    count = sum(ops.values())
    lines = f"lines {members[0].line}–{members[-1].line}"
    return Node(
        node_id,
        key,
        f"{count} ops: {', '.join(op for op, _ in ranked[:2])}{'…' if len(ranked) > 2 else ''}",
        f"module {key}\n{count} ops ({lines}): {listing}",
        fam,
        cluster=cluster_of(key),
        output=any(outputs.intersection(m.outputs) for m in members),
        ops=count,
    )


def _call_text(a: Invocation) -> str:
    """``conv(stride = [2, 2], padding = …)`` with the line and module: the node's tooltip."""
    attrs = ", ".join(f"{k} = {_show(v)}" for k, v in a.attrs.items())
    text = f"{a.op}({attrs})" if attrs else a.op
    where = f"\nmodule {a.scope}" if a.scope else ""
    return f"{text[:400]}\n{', '.join(a.outputs)} (line {a.line}){where}"


def _show(value: Any) -> str:
    if isinstance(value, (Ident, Expr)):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, tuple):
        return "(" + ", ".join(_show(v) for v in value) + ")"
    return repr(value)


def _refs(value: Any) -> list[str]:
    if isinstance(value, Ident):
        return [value.name]
    if isinstance(value, Expr):
        return [n for v in value.args for n in _refs(v)]
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in _refs(v)]
    return []


# ---- Graphviz -----------------------------------------------------------------------------
def dot_source(pic: Picture) -> str:
    """Graphviz text: one ``subgraph cluster_*`` per block, legend of the families drawn."""
    import html

    lines = [
        "digraph torchlower {",
        '  graph [rankdir=TB, fontname="Helvetica", fontsize=11, nodesep=0.25, ranksep=0.35, labelloc=b];',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=11, penwidth=1.2];',
        '  edge [fontname="Helvetica", fontsize=9, color="#555555", fontcolor="#333333", arrowsize=0.7];',
    ]
    by_cluster: dict[str, list[Node]] = {}
    for n in pic.nodes:
        by_cluster.setdefault(n.cluster, []).append(n)
    for index, (cluster, members) in enumerate(by_cluster.items()):
        indent = "  "
        if cluster:
            lines.append(f"  subgraph cluster_{index} {{")
            lines.append(f'    label="{_esc(cluster)}"; labeljust=l; style="rounded,filled";')
            lines.append('    fillcolor="#f6f8fc"; color="#8899bb"; fontsize=12;')
            indent = "    "
        for n in members:
            label = (
                f"<<b>{html.escape(n.title)}</b><br/><font point-size='9'>{html.escape(n.subtitle)}</font>>"
            )
            attrs = f'label={label}, fillcolor="{op_families.color(n.family)}", tooltip="{_esc(n.tooltip)}"'
            if n.shape != "box":
                attrs += f", shape={n.shape}"
            if n.output:
                attrs += ", peripheries=2"
            if n.ops > 1:
                attrs += ', style="rounded,filled,bold"'
            lines.append(f"{indent}{n.id} [{attrs}];")
        if cluster:
            lines.append("  }")
    for e in pic.edges:
        label = f' [label="{_esc(e.label)}"]' if e.label else ""
        lines.append(f"  {e.src} -> {e.dst}{label};")
    cells = "".join(f'<td bgcolor="{op_families.color(f)}">  {html.escape(f)}  </td>' for f in pic.families())
    lines.append(f'  label=<<table border="0" cellspacing="4" cellpadding="3"><tr>{cells}</tr></table>>;')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def write_python_picture(pic: Picture, picture: Path, fmt: str) -> None:
    """Draw without Graphviz: the Python layered layout, written as SVG or rasterized as PNG."""
    from torchlower.cli import picture_layout

    scene = picture_layout.scene(pic)
    if fmt == "svg":
        from torchlower.cli import picture_svg

        picture.write_text(picture_svg.svg(scene))
    else:
        from torchlower.cli import picture_png

        picture.write_bytes(picture_png.png(scene))


def render(dot: str, source: str, picture: Path, fmt: str) -> None:
    """Run Graphviz ``dot``; its failure is an error naming the picture."""
    proc = subprocess.run([dot, f"-T{fmt}", "-o", str(picture)], input=source, text=True, capture_output=True)
    if proc.returncode != 0:
        raise usage_error(f"Graphviz failed to draw {picture}: {proc.stderr.strip()[:500]}")

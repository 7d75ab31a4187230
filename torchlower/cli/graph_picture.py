"""The graph as a picture: one Graphviz node per assignment of ``graph.nnef``.

Nodes are coloured by op family (legend at the bottom), inputs are ellipses, weights are grey
cylinders, outputs have a double border; edges carry the tensor's shape. Input and weight shapes
come from the text; intermediate shapes from one run in tract on random inputs (a copy of the
graph whose outputs are all its tensors), skipped for graphs with symbolic sizes.
"""

from __future__ import annotations

import html
import logging
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchlower.cli.failures import usage_error
from torchlower.errors import TorchlowerError
from torchlower.nnef.parse import Expr, Graph, Ident, Invocation

log = logging.getLogger("torchlower")


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


FAMILIES: dict[str, tuple[str, frozenset[str]]] = {
    "input": ("#b7e1a1", _names("external tract_core_external")),
    "weight": ("#e0e0e0", _names("variable constant")),
    "linear": (
        "#8ecae6",
        _names("conv deconv matmul linear separable_conv separable_deconv tract_core_einsum"),
    ),
    "activation": (
        "#ffb703",
        _names(
            "relu sigmoid tanh elu selu gelu silu softplus leaky_relu prelu clamp softmax log_softmax"
            " hard_swish tract_core_hard_swish tract_core_log_softmax softabs erf tract_core_erf"
        ),
    ),
    "normalization": (
        "#cdb4db",
        _names(
            "batch_normalization moments l1_normalization l2_normalization local_response_normalization"
            " local_mean_normalization local_variance_normalization local_contrast_normalization"
        ),
    ),
    "pooling": (
        "#90be6d",
        _names(
            "max_pool avg_pool rms_pool box debox argmax_pool max_pool_with_index desample nearest_upsample"
            " nearest_downsample area_downsample multilinear_upsample tract_core_resize"
        ),
    ),
    "layout": (
        "#f4a261",
        _names(
            "reshape transpose squeeze unsqueeze concat split slice stack unstack pad tile copy gather"
            " tract_core_broadcast tract_core_shape_of tract_core_gather tract_core_gather_elements"
            " tract_core_gather_nd tract_core_scatter_elements tract_core_range tract_core_one_hot"
            " tract_core_trilu tract_core_cast cast"
        ),
    ),
}
ARITHMETIC_COLOR, REDUCTION_COLOR, TRANSFORMER_COLOR, OTHER_COLOR = "#ffe5b4", "#e9c46a", "#f28482", "#ffffff"


def family(op: str) -> tuple[str, str]:
    """(family, fill colour) of an NNEF op."""
    for name, (color, ops) in FAMILIES.items():
        if op in ops:
            return name, color
    if op.endswith("_reduce") or op in ("tract_core_product_reduce", "tract_core_topk"):
        return "reduction", REDUCTION_COLOR
    if op.startswith("tract_transformers_"):
        return "attention", TRANSFORMER_COLOR
    if op.startswith("tract_"):
        return "other", OTHER_COLOR
    return "arithmetic", ARITHMETIC_COLOR


@dataclass(frozen=True)
class Drawn:
    nodes: int
    edges: int


def draw(artifact: Path, picture: Path, fmt: str, shapes: bool = True) -> Drawn:
    """Write the picture of ``artifact`` to ``picture`` (``svg``, ``png`` or ``dot`` source)."""
    from torchlower import io

    art = io.load(artifact)
    known = declared_shapes(art.graph)
    if shapes and not art.graph.symbols:
        known.update(probe_shapes(artifact, art.graph))
    text, drawn = dot_source(art.graph, known)
    if fmt == "dot":
        picture.write_text(text)
        return drawn
    render(text, picture, fmt)
    return drawn


def declared_shapes(graph: Graph) -> dict[str, str]:
    """Shapes written in the text: inputs (``external``) and weights (``variable``)."""
    known = {i.name: _dims(i.shape) + f" {i.dtype}" for i in graph.inputs}
    known.update({v.name: _dims(v.shape) for v in graph.variables})
    return known


def probe_shapes(artifact: Path, graph: Graph) -> dict[str, str]:
    """Shapes of every computed tensor, from one tract run of a copy listing them all as outputs."""
    from torchlower import io
    from torchlower.nnef import reader

    names = [n for a in graph.assignments if a.call and a.op not in _SOURCE_OPS for n in a.outputs]
    if not names:
        return {}
    try:
        with reader.extracted(artifact) as folder, tempfile.TemporaryDirectory() as tmp:
            copy = Path(tmp, "probe.nnef")
            shutil.copytree(folder, copy)
            text = (folder / "graph.nnef").read_text()
            header = re.compile(r"(graph\s+\w+\s*\([^)]*\)\s*->\s*\()([^)]*)(\))")
            (copy / "graph.nnef").write_text(header.sub(lambda m: m[1] + ", ".join(names) + m[3], text, 1))
            result = io.check(copy)
    except TorchlowerError as exc:
        log.info("intermediate shapes unknown (tract could not run the probe): %s", exc)
        return {}
    if len(result.outputs) != len(names):
        return {}
    return {n: _dims(a.shape) for n, a in zip(names, result.outputs, strict=True)}


_SOURCE_OPS = {"external", "tract_core_external", "variable"}


def _dims(shape: Any) -> str:
    return "×".join(str(d) for d in shape) if len(shape) else "scalar"


def dot_source(graph: Graph, shapes: dict[str, str]) -> tuple[str, Drawn]:
    """Graphviz text with one node per assignment and one edge per tensor use."""
    producer: dict[str, str] = {}
    lines = [
        "digraph torchlower {",
        '  graph [rankdir=TB, fontname="Helvetica", fontsize=11, nodesep=0.25, ranksep=0.35, labelloc=b];',
        '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=11, penwidth=1.2];',
        '  edge [fontname="Helvetica", fontsize=9, color="#555555", fontcolor="#333333", arrowsize=0.7];',
    ]
    outputs = set(graph.outputs)
    used: dict[str, str] = {}
    for i, a in enumerate(graph.assignments):
        node = f"n{i}"
        for name in a.outputs:
            producer[name] = node
        kind, color = family(a.op)
        used.setdefault(kind, color)
        lines.append(f"  {node} [{_node_attrs(a, kind, color, shapes, outputs)}];")
    edges = 0
    for i, a in enumerate(graph.assignments):
        seen: set[str] = set()
        for ref in _refs([a.args, list(a.attrs.values())]):
            if ref in producer and ref not in seen:
                seen.add(ref)
                label = f' [label="{_esc(shapes[ref])}"]' if ref in shapes else ""
                lines.append(f"  {producer[ref]} -> n{i}{label};")
                edges += 1
    lines.append(f"  label=<{_legend(used)}>;")
    lines.append("}")
    return "\n".join(lines) + "\n", Drawn(len(graph.assignments), edges)


def _node_attrs(a: Invocation, kind: str, color: str, shapes: dict[str, str], outputs: set[str]) -> str:
    name = ", ".join(a.outputs)
    small = f"<font point-size='9'>{html.escape(shapes.get(name, ''))}</font>"
    if kind == "input":
        label = f"<<b>{html.escape(name)}</b><br/>{small}>"
        attrs = f'shape=ellipse, fillcolor="{color}"'
    elif kind == "weight":
        tag = str(a.attrs.get("label", name))
        label = f"<{html.escape(tag)}<br/>{small}>"
        attrs = f'shape=cylinder, fontsize=9, fillcolor="{color}", color="#999999"'
    else:
        label = f"<<b>{html.escape(a.op)}</b><br/><font point-size='9'>{html.escape(name)}</font>>"
        attrs = f'fillcolor="{color}"'
    if outputs.intersection(a.outputs):
        attrs += ", peripheries=2"
    return f'label={label}, {attrs}, tooltip="{_esc(a.op)} (line {a.line})"'


def _legend(used: dict[str, str]) -> str:
    cells = "".join(f'<td bgcolor="{c}">  {html.escape(k)}  </td>' for k, c in used.items())
    return f'<table border="0" cellspacing="4" cellpadding="3"><tr>{cells}</tr></table>'


def _refs(value: Any) -> list[str]:
    if isinstance(value, Ident):
        return [value.name]
    if isinstance(value, Expr):
        return [n for v in value.args for n in _refs(v)]
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in _refs(v)]
    return []


def _esc(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def render(source: str, picture: Path, fmt: str) -> None:
    """Run Graphviz ``dot``; a clear error when it is not installed."""
    dot = shutil.which("dot")
    if dot is None:
        raise usage_error(
            "drawing needs Graphviz's `dot` program, which is not installed",
            "install it (Debian/Ubuntu: apt-get install graphviz; macOS: brew install graphviz), or"
            " write the source with --dot graph.dot and render it elsewhere.",
        )
    proc = subprocess.run([dot, f"-T{fmt}", "-o", str(picture)], input=source, text=True, capture_output=True)
    if proc.returncode != 0:
        raise usage_error(f"Graphviz failed to draw {picture}: {proc.stderr.strip()[:500]}")

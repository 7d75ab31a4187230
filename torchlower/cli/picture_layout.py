"""A layered (Sugiyama-style) layout of a ``Picture`` as a ``Scene`` of boxes, curves and text.

``pip install torchlower`` users get pictures on machines without ``dot``: ``picture_svg``
writes a scene as SVG, ``picture_png`` rasterizes the same scene with Pillow. The layout is the
classic recipe in its simplest useful form: layers by longest path from the inputs (in the
graph's own order, so an edge that would close a cycle between collapsed blocks just points
upwards), a virtual point per layer on long edges, a few barycenter sweeps to reduce
crossings with the members of one cluster kept side by side, then x positions relaxed towards
the neighbours' mean.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

from torchlower.cli.picture_model import Node, Picture

CHAR_W, SMALL_W = 7.0, 5.6  # average glyph widths (px) of the 12 / 9.5 px Helvetica text
NODE_H, GAP_X, GAP_Y, PAD = 40.0, 22.0, 46.0, 12.0
SWEEPS = 6


@dataclass
class _Slot:
    """A node or a virtual point of a long edge, in one layer."""

    key: str
    width: float
    cluster: str
    node: Node | None = None
    x: float = 0.0
    y: float = 0.0


def _width(n: Node) -> float:
    return max(64.0, len(n.title) * CHAR_W + 20, len(n.subtitle) * SMALL_W + 20)


def layout(pic: Picture) -> tuple[dict[str, _Slot], list[list[_Slot]], list[list[str]]]:
    """Slots by key, the layers, and each edge's chain of slot keys (source … target)."""
    index = {n.id: i for i, n in enumerate(pic.nodes)}
    layer: dict[str, int] = {}
    preds: dict[str, list[str]] = {n.id: [] for n in pic.nodes}
    for e in pic.edges:
        if index[e.src] < index[e.dst]:
            preds[e.dst].append(e.src)
    for n in pic.nodes:  # the nodes come in the graph's (topological) order
        layer[n.id] = max((layer[p] + 1 for p in preds[n.id]), default=0)
    succs: dict[str, list[str]] = {n.id: [] for n in pic.nodes}
    for e in pic.edges:
        if index[e.src] < index[e.dst]:
            succs[e.src].append(e.dst)
    for n in pic.nodes:  # a weight sits just above its first user, not in the top row
        if not preds[n.id] and succs[n.id] and n.family != "input":
            layer[n.id] = max(0, min(layer[s] for s in succs[n.id]) - 1)
    slots = {n.id: _Slot(n.id, _width(n), n.cluster, n) for n in pic.nodes}
    layers: list[list[_Slot]] = [[] for _ in range(max(layer.values(), default=0) + 1)]
    for n in pic.nodes:
        layers[layer[n.id]].append(slots[n.id])
    chains: list[list[str]] = []
    for k, e in enumerate(pic.edges):
        top, bottom = layer[e.src], layer[e.dst]
        chain = [e.src]
        step = 1 if bottom > top else -1
        for depth in range(top + step, bottom, step):  # a virtual point per crossed layer
            key = f"~{k}.{depth}"
            slots[key] = _Slot(
                key, 8.0, slots[e.src].cluster if slots[e.src].cluster == slots[e.dst].cluster else ""
            )
            layers[depth].append(slots[key])
            chain.append(key)
        chains.append([*chain, e.dst])
    _order(layers, chains)
    _place(layers, chains, slots)
    return slots, layers, chains


def _neighbours(chains: list[list[str]]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    up: dict[str, list[str]] = {}
    down: dict[str, list[str]] = {}
    for chain in chains:
        for a, b in itertools.pairwise(chain):
            down.setdefault(a, []).append(b)
            up.setdefault(b, []).append(a)
    return up, down


def _order(layers: list[list[_Slot]], chains: list[list[str]]) -> None:
    up, down = _neighbours(chains)
    for sweep in range(SWEEPS):
        rows = layers[1:] if sweep % 2 == 0 else layers[-2::-1]
        near = up if sweep % 2 == 0 else down
        for row in rows:
            pos = {s.key: i for layer in layers for i, s in enumerate(layer)}

            def centre(s: _Slot, pos: dict[str, int] = pos, near: dict[str, list[str]] = near) -> float:
                others = [pos[k] for k in near.get(s.key, []) if k in pos]
                return sum(others) / len(others) if others else float(pos[s.key])

            bary = {s.key: centre(s) for s in row}
            groups: dict[str, list[float]] = {}
            for s in row:
                groups.setdefault(s.cluster, []).append(bary[s.key])
            mean = {c: sum(v) / len(v) for c, v in groups.items()}
            row.sort(key=lambda s: (mean[s.cluster] if s.cluster else bary[s.key], bary[s.key]))


def _place(layers: list[list[_Slot]], chains: list[list[str]], slots: dict[str, _Slot]) -> None:
    y = PAD * 3
    for row in layers:
        x = 0.0
        for s in row:
            s.x, s.y = x + s.width / 2, y
            x += s.width + GAP_X
        y += NODE_H + GAP_Y
    up, down = _neighbours(chains)
    for sweep in range(4):
        for row in layers if sweep % 2 == 0 else reversed(layers):
            for s in row:
                near = [slots[k].x for k in up.get(s.key, []) + down.get(s.key, [])]
                if near:
                    s.x = (s.x + 2 * sum(near) / len(near)) / 3
            _separate(row)
    left = min((s.x - s.width / 2 for row in layers for s in row), default=0.0)
    for row in layers:
        for s in row:
            s.x += PAD * 2 - left


def _separate(row: list[_Slot]) -> None:
    """Push slots apart (keeping their order) until none overlap; keeps the row's centre."""
    if not row:
        return
    centre = sum(s.x for s in row) / len(row)
    for a, b in itertools.pairwise(row):
        need = a.x + (a.width + b.width) / 2 + GAP_X
        if b.x < need:
            b.x = need
    shift = centre - sum(s.x for s in row) / len(row)
    for s in row:
        s.x += shift
    for a, b in zip(row[::-1][1:], row[::-1], strict=False):
        need = b.x - (a.width + b.width) / 2 - GAP_X
        if a.x > need:
            a.x = need


Point = tuple[float, float]


@dataclass(frozen=True)
class ClusterBox:
    name: str
    members: int
    x0: float
    y0: float
    x1: float
    y1: float


@dataclass(frozen=True)
class EdgeCurve:
    """An edge through its layers' points; drawn as one cubic Bézier per pair of points."""

    points: tuple[Point, ...]
    label: str

    def segments(self) -> Iterator[tuple[Point, Point, Point, Point]]:
        for (ax, ay), (bx, by) in itertools.pairwise(self.points):
            mid = (ay + by) / 2
            yield (ax, ay), (ax, mid), (bx, mid), (bx, by)

    def label_at(self) -> Point:
        (ax, ay), (bx, by) = self.points[0], self.points[1]
        return (ax + bx) / 2 + 4, (ay + by) / 2


@dataclass(frozen=True)
class NodeBox:
    node: Node
    x: float  # centre
    y: float
    w: float
    h: float


@dataclass(frozen=True)
class LegendItem:
    family: str
    x: float
    y: float
    w: float


@dataclass
class Scene:
    """Everything a renderer draws, in pixels, back to front: clusters, edges, nodes, legend."""

    width: float
    height: float
    clusters: list[ClusterBox] = field(default_factory=list)
    edges: list[EdgeCurve] = field(default_factory=list)
    nodes: list[NodeBox] = field(default_factory=list)
    legend: list[LegendItem] = field(default_factory=list)


def scene(pic: Picture) -> Scene:
    """Lay ``pic`` out and place every shape."""
    slots, layers, chains = layout(pic)
    placed = [s for row in layers for s in row]
    width = max((s.x + s.width / 2 for s in placed), default=100.0) + PAD * 2
    height = max((s.y + NODE_H / 2 for s in placed), default=100.0) + PAD * 2 + 40
    width = max(width, 120.0 * len(pic.families()) / 1.5)
    out = Scene(width, height)
    for cluster in pic.clusters:
        members = [slots[n.id] for n in pic.nodes if n.cluster == cluster]
        out.clusters.append(
            ClusterBox(
                cluster,
                len(members),
                min(s.x - s.width / 2 for s in members) - PAD,
                min(s.y - NODE_H / 2 for s in members) - PAD - 14,
                max(s.x + s.width / 2 for s in members) + PAD,
                max(s.y + NODE_H / 2 for s in members) + PAD,
            )
        )
    out.edges = [_curve(chain, slots, pic.edges[k].label) for k, chain in enumerate(chains)]
    out.nodes = [NodeBox(s.node, s.x, s.y, s.width, NODE_H) for s in placed if s.node is not None]
    x = PAD * 2
    for fam in pic.families():
        w = len(fam) * SMALL_W + 16
        out.legend.append(LegendItem(fam, x, height - 30, w))
        x += w + 6
    return out


def _curve(chain: list[str], slots: dict[str, _Slot], label: str) -> EdgeCurve:
    points = [(slots[k].x, slots[k].y) for k in chain]
    (x0, y0), (x1, y1) = points[0], points[-1]
    down = y1 >= y0
    start = (x0, y0 + NODE_H / 2 if down else y0 - NODE_H / 2)
    end = (x1, y1 - NODE_H / 2 if down else y1 + NODE_H / 2)
    return EdgeCurve((start, *points[1:-1], end), label)

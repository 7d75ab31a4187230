"""What a graph picture shows, before any layout: nodes (ops or collapsed blocks), edges and
module clusters. ``graph_picture`` builds it; the renderers (Graphviz, ``picture_layout`` →
``picture_svg`` / ``picture_png``) read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Node:
    id: str
    title: str  # first line: the op, or the collapsed block's path
    subtitle: str  # second line: module path, tensor name or op count
    tooltip: str
    family: str
    shape: str = "box"  # box | ellipse | cylinder
    cluster: str = ""
    output: bool = False
    ops: int = 1


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    label: str


@dataclass
class Picture:
    nodes: list[Node]
    edges: list[Edge]
    clusters: list[str] = field(default_factory=list)

    def families(self) -> list[str]:
        return list(dict.fromkeys(n.family for n in self.nodes))

"""A ``Scene`` written as a standalone SVG document; tooltips are ``<title>`` elements
(browsers show them on hover)."""

from __future__ import annotations

from html import escape

from torchlower.cli import op_families
from torchlower.cli.picture_layout import ClusterBox, EdgeCurve, NodeBox, Scene


def svg(scene: Scene) -> str:
    out = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{scene.width:.0f}" height="{scene.height:.0f}"'
        f' viewBox="0 0 {scene.width:.0f} {scene.height:.0f}" font-family="Helvetica, Arial, sans-serif">',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7"'
        ' markerHeight="7" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>',
        f'<rect width="{scene.width:.0f}" height="{scene.height:.0f}" fill="white"/>',
    ]
    out += [_cluster(c) for c in scene.clusters]
    out += [_edge(e) for e in scene.edges]
    out += [_node(n) for n in scene.nodes]
    out += [
        f'<g class="legend"><rect x="{i.x:.1f}" y="{i.y:.1f}" width="{i.w:.1f}" height="18" rx="3"'
        f' fill="{op_families.color(i.family)}" stroke="#999"/><text x="{i.x + 8:.1f}" y="{i.y + 13:.1f}"'
        f' font-size="9.5">{escape(i.family)}</text></g>'
        for i in scene.legend
    ]
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _cluster(c: ClusterBox) -> str:
    return (
        f'<g class="cluster"><title>{escape(c.name)} ({c.members} nodes)</title>'
        f'<rect x="{c.x0:.1f}" y="{c.y0:.1f}" width="{c.x1 - c.x0:.1f}" height="{c.y1 - c.y0:.1f}" rx="8"'
        ' fill="#f6f8fc" stroke="#8899bb"/>'
        f'<text x="{c.x0 + 8:.1f}" y="{c.y0 + 14:.1f}" font-size="12" fill="#334">'
        f"{escape(c.name)}</text></g>"
    )


def _edge(e: EdgeCurve) -> str:
    path = f"M{e.points[0][0]:.1f},{e.points[0][1]:.1f}"
    for _, (c1x, c1y), (c2x, c2y), (bx, by) in e.segments():
        path += f" C{c1x:.1f},{c1y:.1f} {c2x:.1f},{c2y:.1f} {bx:.1f},{by:.1f}"
    text = ""
    if e.label:
        lx, ly = e.label_at()
        text = f'<text x="{lx:.1f}" y="{ly:.1f}" font-size="9" fill="#333">{escape(e.label)}</text>'
    return f'<g class="edge"><path d="{path}" fill="none" stroke="#555" marker-end="url(#arrow)"/>{text}</g>'


def _node(b: NodeBox) -> str:
    n = b.node
    fill = op_families.color(n.family)
    x, y, w, h = b.x - b.w / 2, b.y - b.h / 2, b.w, b.h
    if n.shape == "ellipse":
        body = (
            f'<ellipse cx="{b.x:.1f}" cy="{b.y:.1f}" rx="{w / 2:.1f}" ry="{h / 2:.1f}" fill="{fill}"'
            ' stroke="#333"/>'
        )
    else:
        weight = "2.2" if n.ops > 1 else "1.2"
        radius = "2" if n.shape == "cylinder" else "6"
        body = (
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" rx="{radius}" fill="{fill}"'
            f' stroke="#333" stroke-width="{weight}"/>'
        )
    if n.output:
        body += (
            f'<rect x="{x - 3:.1f}" y="{y - 3:.1f}" width="{w + 6:.1f}" height="{h + 6:.1f}" rx="8"'
            ' fill="none" stroke="#333"/>'
        )
    return (
        f'<g class="node" id="{n.id}"><title>{escape(n.tooltip)}</title>{body}'
        f'<text x="{b.x:.1f}" y="{b.y - 3:.1f}" font-size="12" font-weight="bold"'
        f' text-anchor="middle">{escape(n.title)}</text>'
        f'<text x="{b.x:.1f}" y="{b.y + 12:.1f}" font-size="9.5" text-anchor="middle"'
        f' fill="#333">{escape(n.subtitle)}</text></g>'
    )

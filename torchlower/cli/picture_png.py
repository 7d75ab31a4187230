"""A ``Scene`` rasterized as PNG with Pillow, so ``--png`` works without Graphviz.

Pillow ships as a wheel with FreeType and a scalable default font, so ``pip install
torchlower`` is all a user needs. The scene is drawn at twice its size (sharp on high-density
screens) unless the picture would be too large to open: very long graphs are scaled down to
stay under ``MAX_PIXELS``. Pillow writes no timestamp, so the same graph gives the same bytes.
"""

from __future__ import annotations

import io
import math

from PIL import Image, ImageDraw, ImageFont

from torchlower.cli import op_families
from torchlower.cli.picture_layout import EdgeCurve, NodeBox, Point, Scene

MAX_PIXELS = 40_000_000  # ~120 MB of RGB while drawing; image viewers open it
MAX_SIDE = 32_000  # beyond this many viewers refuse a PNG
CURVE_STEPS = 12  # straight pieces per Bézier segment
INK, EDGE_INK = (0x33, 0x33, 0x33), (0x55, 0x55, 0x55)


def scale_for(scene: Scene) -> float:
    """2× for sharpness, less when the picture would be too large to allocate or open."""
    area = max(scene.width * scene.height, 1.0)
    return min(2.0, math.sqrt(MAX_PIXELS / area), MAX_SIDE / max(scene.width, scene.height, 1.0))


def png(scene: Scene) -> bytes:
    k = scale_for(scene)
    image = Image.new("RGB", (max(1, round(scene.width * k)), max(1, round(scene.height * k))), "white")
    pen = _Pen(ImageDraw.Draw(image), k)
    for c in scene.clusters:
        pen.box((c.x0, c.y0, c.x1, c.y1), 8, "#f6f8fc", "#8899bb", 1.0)
        pen.text((c.x0 + 8, c.y0 + 14), c.name, 12, "#334", anchor="ls")
    for e in scene.edges:
        pen.edge(e)
    for n in scene.nodes:
        pen.node(n)
    for i in scene.legend:
        pen.box((i.x, i.y, i.x + i.w, i.y + 18), 3, op_families.color(i.family), "#999", 1.0)
        pen.text((i.x + 8, i.y + 13), i.family, 9.5, INK, anchor="ls")
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


class _Pen:
    """Drawing in scene coordinates; ``k`` maps them to pixels."""

    def __init__(self, draw: ImageDraw.ImageDraw, k: float) -> None:
        self.draw, self.k = draw, k
        self.fonts: dict[float, ImageFont.FreeTypeFont | ImageFont.ImageFont] = {}

    def _px(self, p: Point) -> tuple[float, float]:
        return p[0] * self.k, p[1] * self.k

    def _w(self, width: float) -> int:
        return max(1, round(width * self.k))

    def font(self, size: float) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
        if size not in self.fonts:
            self.fonts[size] = ImageFont.load_default(size=max(1.0, size * self.k))
        return self.fonts[size]

    def box(
        self, xyxy: tuple[float, float, float, float], radius: float, fill: str, line: str, width: float
    ) -> None:
        x0, y0, x1, y1 = (v * self.k for v in xyxy)
        self.draw.rounded_rectangle(
            (x0, y0, x1, y1), radius * self.k, fill=fill, outline=line, width=self._w(width)
        )

    def text(
        self,
        at: Point,
        text: str,
        size: float,
        fill: str | tuple[int, int, int],
        *,
        anchor: str,
        bold: bool = False,
    ) -> None:
        stroke = max(1, round(self.k / 2)) if bold and self.k >= 1 else 0
        text = text.replace("×", "x")  # Pillow's default font has no multiplication sign
        self.draw.text(
            self._px(at), text, font=self.font(size), fill=fill, anchor=anchor,
            stroke_width=stroke, stroke_fill=fill,
        )  # fmt: skip

    def edge(self, e: EdgeCurve) -> None:
        points: list[Point] = [e.points[0]]
        for p0, c1, c2, p3 in e.segments():
            points += [_bezier(p0, c1, c2, p3, i / CURVE_STEPS) for i in range(1, CURVE_STEPS + 1)]
        self.draw.line([self._px(p) for p in points], fill=EDGE_INK, width=self._w(1.0))
        (ax, ay), (bx, by) = points[-2], points[-1]
        angle = math.atan2(by - ay, bx - ax)
        tip = [(bx, by)] + [
            (bx - 7 * math.cos(angle + s * 0.45), by - 7 * math.sin(angle + s * 0.45)) for s in (1, -1)
        ]
        self.draw.polygon([self._px(p) for p in tip], fill=EDGE_INK)
        if e.label:
            self.text(e.label_at(), e.label, 9, INK, anchor="lm")

    def node(self, b: NodeBox) -> None:
        n = b.node
        fill = op_families.color(n.family)
        x0, y0, x1, y1 = b.x - b.w / 2, b.y - b.h / 2, b.x + b.w / 2, b.y + b.h / 2
        if n.shape == "ellipse":
            self.draw.ellipse(
                tuple(v * self.k for v in (x0, y0, x1, y1)), fill=fill, outline=INK, width=self._w(1.2)
            )
        else:
            self.box(
                (x0, y0, x1, y1), 2 if n.shape == "cylinder" else 6, fill, "#333", 2.2 if n.ops > 1 else 1.2
            )
        if n.output:
            x0, y0, x1, y1 = (v * self.k for v in (x0 - 3, y0 - 3, x1 + 3, y1 + 3))
            self.draw.rounded_rectangle((x0, y0, x1, y1), 8 * self.k, outline=INK, width=self._w(1.0))
        self.text((b.x, b.y - 3), n.title, 12, "black", anchor="ms", bold=True)
        self.text((b.x, b.y + 12), n.subtitle, 9.5, INK, anchor="ms")


def _bezier(p0: Point, c1: Point, c2: Point, p3: Point, t: float) -> Point:
    u = 1 - t
    return (
        u**3 * p0[0] + 3 * u * u * t * c1[0] + 3 * u * t * t * c2[0] + t**3 * p3[0],
        u**3 * p0[1] + 3 * u * u * t * c1[1] + 3 * u * t * t * c2[1] + t**3 * p3[1],
    )

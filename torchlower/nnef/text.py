"""Printing NNEF text: literals, assignments and the graph document."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from torchlower.core.values import SymDim, Value

_IDENT = re.compile(r"[^A-Za-z0-9_]")


def identifier(hint: str) -> str:
    """A valid NNEF identifier derived from ``hint`` (torch names contain dots and colons)."""
    name = _IDENT.sub("_", hint).strip("_") or "v"
    if name.startswith(("true", "false")):  # tract's parser reads `truediv_2` as `true` + garbage
        return f"v_{name}"
    return name if not name[0].isdigit() else f"v{name}"


def name_text(name: str) -> str:
    """A tensor name as NNEF text: plain if it is an identifier, else tract's escaped form
    ``i"extra.probs"`` (output names taken from nested dict keys contain dots)."""
    if _IDENT.search(name) is None and name and not name[0].isdigit():
        return name
    return 'i"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def literal(value: Any, names: dict[str, str]) -> str:
    """NNEF text of an argument: values by name, Python scalars/lists/tuples as literals."""
    if isinstance(value, Value):
        return name_text(names.get(value.name, value.name))
    if isinstance(value, SymDim):
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return float_literal(value)
    if isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(value, tuple):
        return "(" + ", ".join(literal(v, names) for v in value) + ")"
    if isinstance(value, list):
        return "[" + ", ".join(literal(v, names) for v in value) + "]"
    raise TypeError(f"cannot print {type(value).__name__} as an NNEF literal")


def float_literal(value: float) -> str:
    """Shortest exact text of a float, always with a '.' or exponent (NNEF reads it as scalar)."""
    if math.isinf(value):
        # NNEF has no inf literal; the largest finite f32 saturates the same way in practice.
        return "-3.4028234663852886e38" if value < 0 else "3.4028234663852886e38"
    if math.isnan(value):
        raise ValueError("NaN cannot be written as an NNEF literal")
    text = repr(float(value))
    return text if any(c in text for c in ".e") else text + ".0"


@dataclass
class Assignment:
    """``outputs = op(args, attrs)``; values are resolved to names only when printed."""

    outputs: list[Value]
    op: str
    args: list[Any]
    attrs: dict[str, Any]
    scope: str = ""  # module path of the PyTorch module it came from ("" for the top level)

    def render(self, names: dict[str, str]) -> str:
        left = ", ".join(literal(v, names) for v in self.outputs)
        if len(self.outputs) > 1:
            left = f"({left})"
        parts = [literal(a, names) for a in self.args]
        parts += [f"{k} = {literal(v, names)}" for k, v in self.attrs.items()]
        return f"    {left} = {self.op}({', '.join(parts)});"


SCOPE_COMMENT = "# module: "
SIZES_COMMENT = "# example sizes: "  # symbol sizes of the inputs the export traced and verified
STREAM_COMMENT = "# streaming: "  # the pulse and delay export(stream=) verified in tract's pulse


def with_scopes(assignments: Sequence[Assignment], lines: Sequence[str]) -> list[str]:
    """``lines`` (one per assignment) with a ``# module: PATH`` comment wherever the module
    changes. tract and the Khronos parser skip comments; the picture and ``inspect`` read them
    to group nodes by module (``nnef/graph_check.py`` attaches them to the assignments)."""
    out: list[str] = []
    current = ""
    for a, line in zip(assignments, lines, strict=True):
        if a.scope != current:
            current = a.scope
            out.append(f"    {SCOPE_COMMENT}{_comment_safe(current)}".rstrip())
        out.append(line)
    return out


def _comment_safe(path: str) -> str:
    return "".join(c for c in path if c.isprintable() and c not in "\r\n")


def document(
    extensions: Sequence[str],
    inputs: Sequence[str],
    outputs: Sequence[str],
    body: Sequence[str],
    fragments: Sequence[str] = (),
) -> str:
    """The whole ``graph.nnef``: deterministic, no dates, hosts or users."""
    lines = ["version 1.0;", ""]
    lines += [f"extension {e};" for e in extensions]
    if extensions:
        lines.append("")
    if fragments:
        lines += [*list(fragments), ""]
    lines.append(f"graph network({', '.join(inputs)}) -> ({', '.join(map(name_text, outputs))})")
    lines.append("{")
    lines += list(body)
    lines.append("}")
    return "\n".join(lines) + "\n"

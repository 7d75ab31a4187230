"""Consistency checks on a parsed ``graph.nnef`` and the metadata torchlower's comments carry.

The text is untrusted: a reference to nothing, an unknown op or a malformed variable is an
``ArtifactError`` naming the line, before any runtime sees the graph."""

from __future__ import annotations

import re

from torchlower.errors import ArtifactError
from torchlower.nnef.graph_model import Graph, Invocation, Variable, referenced_names
from torchlower.nnef.known_ops import is_known_op

_SCOPE = re.compile(r"^[ \t]*# module: ?(.*)$")


_SIZES = re.compile(r"^# example sizes: ((?:[A-Za-z_]\w*=\d{1,12}(?:, )?)+)$", re.MULTILINE)
_STREAM = re.compile(
    r"^# streaming: ([A-Za-z_]\w*) pulse=(\d{1,9}) delay=(\d{1,12}) multiple=(\d{1,9})"
    r" inputs=((?:\w+:\d{1,2},?)+) outputs=((?:\w+:\d{1,2}:\d{1,12},?)+)$",
    re.MULTILINE,
)


def attach_metadata(graph: Graph, text: str) -> None:
    """Give each assignment the module path of the last ``# module:`` comment before its line;
    read the example sizes of declared symbols."""
    sizes = _SIZES.search(text[:65536])
    if sizes:
        pairs = (item.split("=") for item in sizes.group(1).split(", ") if item)
        graph.example_sizes = {k: int(v) for k, v in pairs if k in graph.symbols}
    stream = _STREAM.search(text[:65536])
    if stream and stream.group(1) in graph.symbols:
        symbol, pulse, delay, multiple, ins, outs = stream.groups()
        graph.streaming = {
            "symbol": symbol,
            "pulse": int(pulse),
            "delay": int(delay),
            "multiple": int(multiple),
            "inputs": {n: int(a) for n, a in (item.split(":") for item in ins.split(",") if item)},
            "outputs": {
                n: [int(a), int(d)] for n, a, d in (item.split(":") for item in outs.split(",") if item)
            },
        }
    lines = text.split("\n")
    marks = [(i + 1, m.group(1).strip()) for i, line in enumerate(lines) if (m := _SCOPE.match(line))]
    if not marks:
        return
    k, scope = 0, ""
    for a in graph.assignments:
        while k < len(marks) and marks[k][0] < a.line:
            scope = marks[k][1][:1000]
            k += 1
        a.scope = scope


def check_graph(graph: Graph) -> None:
    """Single assignment, references to defined names only, known ops, declared I/O."""
    fragments = set(graph.fragments)
    symbols = set(graph.symbols)
    first_line: dict[str, int] = {}
    for a in graph.assignments:
        if len(set(a.outputs)) != len(a.outputs):
            raise ArtifactError(f"graph.nnef line {a.line}: a name appears twice on the left of '='")
        for name in a.outputs:
            if name in first_line:
                graph.reassigned.setdefault(name, first_line[name])
            else:
                first_line[name] = a.line
    defined: set[str] = set()
    for a in graph.assignments:
        if a.call and not is_known_op(a.op) and a.op not in fragments:
            raise ArtifactError(f"graph.nnef line {a.line}: unknown op {a.op!r}")
        for ref in referenced_names([a.args, list(a.attrs.values())]):
            if ref in defined or ref in symbols:
                continue
            if ref in first_line:
                raise ArtifactError(
                    f"graph.nnef line {a.line}: {ref!r} is used before its assignment"
                    f" at line {first_line[ref]}"
                )
            raise ArtifactError(f"graph.nnef line {a.line}: {ref!r} is not defined")
        if a.op == "variable":
            graph.variables.append(_variable(a))
        defined.update(a.outputs)
    for name in graph.outputs:
        if name not in defined:
            raise ArtifactError(f"graph.nnef: output {name!r} is never assigned")
    for inp in graph.inputs:
        if inp.name in graph.reassigned:
            again = next(a.line for a in graph.assignments if inp.name in a.outputs and a.line != inp.line)
            raise ArtifactError(
                f"graph.nnef line {again}: input {inp.name!r} is assigned again (declared at line {inp.line})"
            )
        if not inp.line:
            raise ArtifactError(
                f"graph.nnef: input {inp.name!r} is not declared with external/tract_core_external"
            )
    if len({i.name for i in graph.inputs}) != len(graph.inputs):
        raise ArtifactError("graph.nnef: an input is listed twice in the graph header")
    if len(set(graph.outputs)) != len(graph.outputs):
        raise ArtifactError("graph.nnef: an output is listed twice in the graph header")


def _variable(a: Invocation) -> Variable:
    label, shape = a.attrs.get("label"), a.attrs.get("shape")
    if len(a.outputs) != 1 or not isinstance(label, str) or not label:
        raise ArtifactError(f"graph.nnef line {a.line}: variable needs one result and a string label")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ArtifactError(f"graph.nnef line {a.line}: variable {label!r} needs shape = [non-negative ints]")
    kind = a.generic or "scalar"
    if kind not in ("scalar", "integer", "logical"):
        raise ArtifactError(f"graph.nnef line {a.line}: variable<{kind}> is not a tensor type")
    return Variable(a.outputs[0], label, tuple(shape), kind, a.line)

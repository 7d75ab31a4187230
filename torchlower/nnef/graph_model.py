"""The parsed form of ``graph.nnef``: what the parser returns and readers (runner, pictures,
inspection) walk. Kept apart from the parser so a reader imports data, not grammar."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Ident:
    """A reference to a tensor or a symbol (``B``) inside an argument."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Expr:
    """Arithmetic on literals and identifiers (``B * 2``, ``-S``)."""

    op: str
    args: tuple[Any, ...]

    def __str__(self) -> str:
        if self.op in ("min", "max"):
            return f"{self.op}({', '.join(_show(a) for a in self.args)})"
        if len(self.args) == 1:
            return f"{self.op}{_show(self.args[0])}"
        return f"({_show(self.args[0])} {self.op} {_show(self.args[1])})"


@dataclass
class Invocation:
    """``outputs = op<generic>(args, attrs);`` at ``line``."""

    line: int
    outputs: list[str]
    op: str
    generic: str | None
    args: list[Any]
    attrs: dict[str, Any]
    call: bool = True  # False for tract's plain ``x = [[0.5]];`` / ``y = x;`` (op "literal" / "alias")
    scope: str = ""  # module path from the nearest ``# module: PATH`` comment above (torchlower's)


@dataclass(frozen=True)
class Input:
    name: str
    shape: tuple[Any, ...]  # ints, symbol names (str) or Expr
    dtype: str  # tract datum type ('f32', 'i64', ...) or 'scalar'/'integer'/'logical'
    line: int


@dataclass(frozen=True)
class Variable:
    name: str
    label: str
    shape: tuple[int, ...]
    kind: str  # scalar | integer | logical
    line: int


@dataclass
class Graph:
    """What ``graph.nnef`` declares, checked for internal consistency."""

    name: str
    version: str
    extensions: list[str]
    symbols: list[str]
    fragments: list[str]
    inputs: list[Input]
    outputs: list[str]
    assignments: list[Invocation]
    variables: list[Variable] = field(default_factory=list)
    # name -> line of its first assignment, for names assigned again later. tract accepts this
    # (its builder's scope is a map: a later assignment shadows the earlier one from there on)
    # and torch_to_nnef writes it for shapes; the Khronos parser refuses it. torchlower never does.
    reassigned: dict[str, int] = field(default_factory=dict)
    # ``# example sizes: B=2, S=6`` (torchlower's): the sizes the export traced and verified at
    example_sizes: dict[str, int] = field(default_factory=dict)
    # ``# streaming: T pulse=16 delay=8 …`` (torchlower's): what export(stream=) verified, as
    # {"symbol", "pulse", "delay", "multiple", "inputs": {name: axis}, "outputs": {name: [axis, delay]}}
    streaming: dict[str, Any] = field(default_factory=dict)

    def op_histogram(self) -> Counter[str]:
        return Counter(a.op for a in self.assignments)


def _show(value: Any) -> str:
    return str(value) if isinstance(value, (Ident, Expr)) else repr(value)


def referenced_names(value: Any) -> list[str]:
    """Every identifier an argument refers to, arithmetic and nesting included."""
    if isinstance(value, Ident):
        return [value.name]
    if isinstance(value, Expr):
        return [n for v in value.args for n in referenced_names(v)]
    if isinstance(value, (list, tuple)):
        return [n for v in value for n in referenced_names(v)]
    return []


def evaluate(dim: Any, env: Mapping[str, int]) -> int | None:
    """The integer value of a size expression (``/`` floors, as tract's sizes do), None if a
    symbol is unbound or the expression is not integer arithmetic."""
    if isinstance(dim, bool):
        return None
    if isinstance(dim, int):
        return dim
    if isinstance(dim, (str, Ident)):
        return env.get(str(dim))
    if not isinstance(dim, Expr):
        return None
    values = [evaluate(a, env) for a in dim.args]
    if any(v is None for v in values) or not values:
        return None
    if dim.op in ("min", "max"):
        return (min if dim.op == "min" else max)(values)  # type: ignore[type-var]
    if len(values) == 1:
        return -values[0] if dim.op == "-" else values[0]  # type: ignore[operator]
    a, b = values
    assert a is not None and b is not None
    table = {
        "+": a + b,
        "-": a - b,
        "*": a * b,
        "/": a // b if b else None,
        "^": a**b if 0 <= b < 64 else None,
    }
    return table.get(dim.op)

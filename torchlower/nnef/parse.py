"""A small, strict parser of ``graph.nnef`` as torchlower and tract write it.

The text is untrusted: every defect (truncation, a reference to nothing, an unknown op,
nesting deep enough to exhaust the stack) is an ``ArtifactError`` that names the line.
Fragment definitions (tract writes ``tract_core_properties`` as one) are skipped: their
names are recorded and become known ops, their bodies are not interpreted.
Only what a graph body needs is accepted: invocations whose arguments are literals,
identifiers, arrays, tuples and arithmetic on them (symbolic dims such as ``B * 2``). What
tract accepts beyond the Khronos grammar is accepted too, because other exporters write it:
a name assigned again (the later value shadows the earlier one, as in tract), bare tuple
results (``a, b = op(...)``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from torchlower.errors import ArtifactError
from torchlower.nnef.graph_check import attach_metadata, check_graph
from torchlower.nnef.graph_model import Expr, Graph, Ident, Input, Invocation, Variable, referenced_names

__all__ = ["Expr", "Graph", "Ident", "Input", "Invocation", "Variable", "parse", "tokenize"]

MAX_DEPTH = 64  # nesting of arrays/tuples/expressions; real graphs use < 5
MAX_INT = 2**63 - 1

_TOKEN = re.compile(
    r"""(?P<space>[ \t\r]+|\#[^\n]*)
      |(?P<newline>\n)
      |(?P<esc_id>i(?:'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*"))
      |(?P<id>[A-Za-z_][A-Za-z0-9_]*)
      |(?P<num>[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)
      |(?P<str>'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")
      |(?P<op>->|<=|>=|==|!=|&&|\|\||[()\[\]{}<>,;:=+\-*/^?!])""",
    re.VERBOSE,
)


@dataclass
class _Tok:
    kind: str
    text: str
    line: int
    start: int


def tokenize(text: str) -> list[_Tok]:
    tokens, line, pos = [], 1, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            snippet = text[pos : pos + 20].split("\n")[0]
            if text[pos] in "'\"":
                raise ArtifactError(f"graph.nnef line {line}: unterminated string {snippet!r}")
            raise ArtifactError(f"graph.nnef line {line}: unexpected character {text[pos]!r}")
        kind = m.lastgroup or ""
        if kind == "newline":
            line += 1
        elif kind != "space":
            tokens.append(_Tok(kind, m.group(), line, pos))
        pos = m.end()
    tokens.append(_Tok("eof", "", line, pos))
    return tokens


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.toks = tokenize(text)
        self.i = 0

    # ---- token helpers -----------------------------------------------------------------
    @property
    def tok(self) -> _Tok:
        return self.toks[self.i]

    def fail(self, message: str, tok: _Tok | None = None) -> ArtifactError:
        tok = tok or self.tok
        if tok.kind == "eof":
            return ArtifactError(f"graph.nnef line {tok.line}: text ends early (truncated?): {message}")
        return ArtifactError(f"graph.nnef line {tok.line}: {message}, found {tok.text!r}")

    def take(self, text: str) -> _Tok:
        if self.tok.text != text or self.tok.kind in ("str", "esc_id"):
            raise self.fail(f"expected {text!r}")
        self.i += 1
        return self.toks[self.i - 1]

    def accept(self, text: str) -> bool:
        if self.tok.text == text and self.tok.kind not in ("str", "esc_id"):
            self.i += 1
            return True
        return False

    def ident(self) -> str:
        tok = self.tok
        if tok.kind == "id":
            self.i += 1
            return tok.text
        if tok.kind == "esc_id":
            self.i += 1
            return _unquote(tok.text[1:])
        raise self.fail("expected an identifier")

    # ---- document ----------------------------------------------------------------------
    def document(self) -> Graph:
        if self.tok.text != "version":
            raise self.fail("the document must start with 'version 1.0;'")
        self.i += 1
        version = self.tok.text
        if self.tok.kind != "num" or not version.startswith("1."):
            raise self.fail("unsupported NNEF version (expected 1.x)")
        self.i += 1
        self.take(";")
        extensions: list[str] = []
        while self.tok.text == "extension":
            extensions.append(self.extension())
        fragments: list[str] = []
        while self.tok.text == "fragment":
            fragments.append(self.fragment())
        graph = self.graph(version, extensions, fragments)
        if self.tok.kind != "eof":
            raise self.fail("unexpected text after the graph body")
        return graph

    def extension(self) -> str:
        first = self.take("extension")
        while self.tok.text != ";":
            if self.tok.kind == "eof":
                raise self.fail("unterminated extension line")
            self.i += 1
        end = self.tok.start
        self.i += 1
        raw = " ".join(self.text[first.start + len("extension") : end].split())
        if not raw:
            raise self.fail("empty extension line", first)
        return raw

    def fragment(self) -> str:
        """Skip a fragment declaration or definition (balanced braces); return its name."""
        self.take("fragment")
        name = self.ident()
        depth = 0
        while True:
            tok = self.tok
            if tok.kind == "eof":
                raise self.fail(f"unterminated fragment {name!r}")
            self.i += 1
            if tok.kind in ("str", "esc_id"):
                continue
            if tok.text == "{":
                depth += 1
            elif tok.text == "}":
                depth -= 1
                if depth == 0:
                    return name
            elif tok.text == ";" and depth == 0:
                return name

    def graph(self, version: str, extensions: list[str], fragments: list[str]) -> Graph:
        self.take("graph")
        name = self.ident()
        inputs = self.names_in_parens()
        self.take("->")
        outputs = self.names_in_parens()
        self.take("{")
        body: list[Invocation] = []
        while not self.accept("}"):
            body.append(self.assignment())
        graph = Graph(name, version, extensions, _symbols(extensions), fragments, [], outputs, body)
        graph.inputs = [_input(body, n) for n in inputs]  # placeholder order, validated below
        return graph

    def names_in_parens(self) -> list[str]:
        self.take("(")
        names: list[str] = []
        if not self.accept(")"):
            names.append(self.ident())
            while self.accept(","):
                names.append(self.ident())
            self.take(")")
        return names

    def assignment(self) -> Invocation:
        line = self.tok.line
        outputs = self.lvalue(0)
        while self.accept(","):  # a bare tuple: ``h, c = op(...)`` (torch_to_nnef's LSTM)
            outputs += self.lvalue(1)
        self.take("=")
        op_tok = self.tok
        if not self._is_call():
            value = self.expr(0)
            self.take(";")
            op = "alias" if referenced_names(value) else "literal"
            return Invocation(line, outputs, op, None, [value], {}, call=False)
        op = self.ident()
        generic = None
        if self.accept("<"):
            generic = self.ident()
            self.take(">")
        if self.tok.text != "(":
            raise self.fail("a graph body assignment must be an op invocation", op_tok)
        self.take("(")
        args: list[Any] = []
        attrs: dict[str, Any] = {}
        if not self.accept(")"):
            while True:
                self.argument(args, attrs)
                if self.accept(")"):
                    break
                self.take(",")
        self.take(";")
        return Invocation(line, outputs, op, generic, args, attrs)

    def _is_call(self) -> bool:
        """An op invocation ``name(`` or ``name<type>(`` starts here (not a plain value)."""
        if self.tok.kind not in ("id", "esc_id") or self.tok.text in ("true", "false"):
            return False
        nxt = self.toks[self.i + 1]
        if nxt.text == "<" and nxt.kind == "op":
            return self.toks[self.i + 3].text == ">" if self.i + 3 < len(self.toks) else True
        return nxt.text == "(" and nxt.kind == "op"

    def lvalue(self, depth: int) -> list[str]:
        if depth > MAX_DEPTH:
            raise self.fail(f"nesting deeper than {MAX_DEPTH}")
        close = {"(": ")", "[": "]"}.get(self.tok.text) if self.tok.kind == "op" else None
        if close is None:
            return [self.ident()]
        self.i += 1
        names = self.lvalue(depth + 1)
        while self.accept(","):
            names += self.lvalue(depth + 1)
        self.take(close)
        return names

    def argument(self, args: list[Any], attrs: dict[str, Any]) -> None:
        nxt = self.toks[self.i + 1]
        if self.tok.kind == "id" and nxt.text == "=" and nxt.kind == "op":
            key = self.ident()
            self.i += 1
            if key in attrs:
                raise self.fail(f"attribute {key!r} given twice")
            attrs[key] = self.expr(0)
        else:
            if attrs:
                raise self.fail("positional argument after a named one")
            args.append(self.expr(0))

    # ---- expressions -------------------------------------------------------------------
    def expr(self, depth: int) -> Any:
        return self.binary(depth, 0)

    _LEVELS = (("+", "-"), ("*", "/"), ("^",))

    def binary(self, depth: int, level: int) -> Any:
        if level == len(self._LEVELS):
            return self.unary(depth)
        left = self.binary(depth, level + 1)
        while self.tok.kind == "op" and self.tok.text in self._LEVELS[level]:
            op = self.tok.text
            self.i += 1
            left = Expr(op, (left, self.binary(depth, level + 1)))
        return left

    def unary(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise self.fail(f"nesting deeper than {MAX_DEPTH}")
        if self.tok.kind == "op" and self.tok.text in "+-" and self.tok.text:
            op = self.tok.text
            self.i += 1
            value = self.unary(depth + 1)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return -value if op == "-" else value
            return Expr(op, (value,))
        return self.primary(depth)

    def _next_is(self, text: str) -> bool:
        return self.i + 1 < len(self.toks) and self.toks[self.i + 1].text == text

    def primary(self, depth: int) -> Any:
        tok = self.tok
        if tok.kind == "num":
            self.i += 1
            if any(c in tok.text for c in ".eE"):
                return float(tok.text)
            value = int(tok.text)
            if value > MAX_INT:
                raise self.fail("integer literal out of the 64-bit range", tok)
            return value
        if tok.kind == "str":
            self.i += 1
            return _unquote(tok.text)
        if tok.kind == "id" and tok.text in ("true", "false"):
            self.i += 1
            return tok.text == "true"
        if tok.kind == "id" and tok.text in _SIZE_FUNCTIONS and self._next_is("("):
            self.i += 2  # tract's TDim min(a, b) / max(a, b) in a size attribute
            args = [self.expr(depth + 1)]
            while self.accept(","):
                args.append(self.expr(depth + 1))
            self.take(")")
            return Expr(tok.text, tuple(args))
        if tok.kind in ("id", "esc_id"):
            return Ident(self.ident())
        if tok.text in ("[", "(") and tok.kind == "op":
            close = "]" if tok.text == "[" else ")"
            self.i += 1
            items: list[Any] = []
            if not self.accept(close):
                items.append(self.expr(depth + 1))
                while self.accept(","):
                    items.append(self.expr(depth + 1))
                self.take(close)
            if close == "]":
                return items
            return items[0] if len(items) == 1 else tuple(items)
        raise self.fail("expected a value")


_SIZE_FUNCTIONS = ("min", "max")


def _unquote(quoted: str) -> str:
    return re.sub(r"\\(.)", r"\1", quoted[1:-1])


def _symbols(extensions: list[str]) -> list[str]:
    return [e.split()[1] for e in extensions if e.split()[0] == "tract_symbol" and len(e.split()) == 2]


def _input(body: list[Invocation], name: str) -> Input:
    for a in body:
        if name in a.outputs and a.op in ("external", "tract_core_external"):
            shape = a.attrs.get("shape", [])
            dtype = a.attrs.get("datum_type", a.generic or "scalar")
            shape_t = tuple(d.name if isinstance(d, Ident) else d for d in _as_list(shape))
            return Input(name, shape_t, str(dtype), a.line)
    return Input(name, (), "", 0)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else [value]


def parse(text: str | bytes) -> Graph:
    """Parse and check ``graph.nnef``; raises ``ArtifactError`` with a line number."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = text[: exc.start].count(b"\n") + 1
            raise ArtifactError(f"graph.nnef line {line}: not UTF-8 text") from None
    if "\0" in text:
        line = text[: text.index("\0")].count("\n") + 1
        raise ArtifactError(f"graph.nnef line {line}: NUL byte in the text")
    graph = _Parser(text).document()
    check_graph(graph)
    attach_metadata(graph, text)
    return graph

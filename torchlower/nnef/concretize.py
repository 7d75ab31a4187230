"""``graph.nnef`` with its symbols replaced by the sizes of one run: a static graph of that size.

Why not tract's own ``SetSymbols``: it applies after tract has loaded the graph, and loading is
where a dynamic graph costs most — tract 0.23.9 takes ~60x longer to load wav2vec2's archive with
``T`` symbolic (nested floor divisions through seven strided convolutions) than at a fixed
``T``, and lowers a convolution over symbolic spatial sizes to im2col. The same text with the
sizes written in loads and optimizes as fast as a static export and picks the same kernels.

tract computes an expression of integer literals with integer arithmetic (``7 / 2`` is 3), which
equals its symbolic floor division as long as no division sees a negative operand; ``concretize``
returns None (the caller then uses ``SetSymbols``) when one would, when a symbol's name is also
a tensor's, or when an assertion on a replaced symbol is not one the runner checked itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from torchlower.errors import ArtifactError
from torchlower.nnef.graph_model import Expr, evaluate
from torchlower.nnef.parse import parse, tokenize

# assertions the runner checks before tract sees the inputs (runner.bind, inputs.check_sum_bounds),
# and LLM scenario lines (``tg: S == 1``), which name a case rather than constrain the sizes
_CHECKED = re.compile(
    r"tract_assert\s+(?:[A-Za-z_]\w*(?:\s*\+\s*[A-Za-z_]\w*)*\s*(?:<=|>=)\s*-?\d+|[A-Za-z_]\w*\s*:.*)\Z"
)


def concretize(text: str, sizes: Mapping[str, int]) -> str | None:
    """``text`` with every symbol of ``sizes`` written as its value (its ``tract_symbol`` and
    ``tract_assert`` lines dropped), or None when that would not compute what tract computes."""
    if not sizes:
        return text
    try:
        graph = parse(text)
    except ArtifactError:
        return None
    names = {n for a in graph.assignments for n in a.outputs}
    header = text[: text.find("graph ")].split("\n")
    if names & set(sizes) or any("," in line and _declares(line, sizes) for line in header):
        return None  # a tensor named like a symbol; several extensions on one line
    for ext in graph.extensions:
        bounded = ext.split()[0] == "tract_assert" and set(re.findall(r"[A-Za-z_]\w*", ext)) & set(sizes)
        if bounded and not _CHECKED.match(ext.strip()):
            return None
    exprs = [e for a in graph.assignments for v in (*a.args, *a.attrs.values()) for e in _exprs(v)]
    if any(_negative_division(e, sizes) for e in exprs):
        return None
    return _rewrite(text, sizes)


def _exprs(value: Any) -> Iterator[Expr]:
    if isinstance(value, Expr):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _exprs(v)


def _negative_division(expr: Expr, sizes: Mapping[str, int]) -> bool:
    """Whether a division inside ``expr`` that becomes literal sees a value below 0 (literal
    integer division truncates, tract's symbolic one floors)."""
    if expr.op == "/" and len(expr.args) == 2:
        a, b = (evaluate(x, sizes) for x in expr.args)
        if a is not None and b is not None and (a < 0 or b <= 0):
            return True
    return any(_negative_division(x, sizes) for x in expr.args if isinstance(x, Expr))


def _rewrite(text: str, sizes: Mapping[str, int]) -> str:
    """Replace the symbol tokens of the graph body (not strings, names of attributes or calls)
    and drop the header lines that declare or bound them."""
    tokens = tokenize(text)
    body = next(i for i, t in enumerate(tokens) if t.kind == "id" and t.text == "graph")
    out, pos = [], tokens[body].start
    for tok, nxt in zip(tokens[body:], tokens[body + 1 :], strict=False):
        if tok.kind == "id" and tok.text in sizes and nxt.text not in ("=", "("):
            out += [text[pos : tok.start], str(int(sizes[tok.text]))]
            pos = tok.start + len(tok.text)
    out.append(text[pos:])
    head = [line for line in text[: tokens[body].start].split("\n") if not _declares(line, sizes)]
    return "\n".join(head) + "".join(out)


def _declares(line: str, sizes: Mapping[str, int]) -> bool:
    """An ``extension tract_symbol S;`` / ``extension tract_assert … S …;`` line of a replaced S."""
    words = line.strip().rstrip(";").split()
    if len(words) < 2 or words[0] != "extension" or words[1] not in ("tract_symbol", "tract_assert"):
        return False
    return bool(set(re.findall(r"[A-Za-z_]\w*", " ".join(words[2:]))) & set(sizes))

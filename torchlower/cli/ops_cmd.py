"""``torchlower ops [--markdown]``: the support table, read from the rule registry itself."""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from rich.table import Table

from torchlower.cli.console import Output


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "ops",
        parents=[common],
        help="list supported ops: ATen name, family, front ends",
        description="Every registered lowering rule: ATen ops (seen by every front end), Python"
        " functions and whole modules (seen by the fx front end).",
    )
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.set_defaults(run=run)


def support_table() -> list[dict[str, Any]]:
    """One row per rule key, sorted by family then name."""
    from torchlower.api import FRONTENDS
    from torchlower.rules import NNEF_RULES
    from torchlower.rules.registry import describe

    NNEF_RULES.ensure_loaded()
    rows = []
    for key, rule in NNEF_RULES.functions.items():
        aten = isinstance(key, str)
        rows.append(
            {
                "op": describe(key),
                "kind": "op" if aten else "function",
                "family": rule.family,
                "frontends": list(FRONTENDS) if aten else [f for f in FRONTENDS if f == "fx"],
                "rule": f"{rule.fn.__module__}.{rule.fn.__qualname__}",
            }
        )
    for module_type, rule in NNEF_RULES.modules.items():
        rows.append(
            {
                "op": f"{module_type.__module__}.{module_type.__qualname__}",
                "kind": "module",
                "family": rule.family,
                "frontends": [f for f in FRONTENDS if f == "fx"],
                "rule": f"{rule.fn.__module__}.{rule.fn.__qualname__}",
            }
        )
    return sorted(rows, key=lambda r: (r["family"], r["kind"], r["op"]))


def run(args: argparse.Namespace, out: Output) -> int:
    rows = support_table()
    if args.markdown and not args.json:
        print(markdown(rows))
        return 0
    data = {"ok": True, "count": len(rows), "ops": rows}
    out.emit(data, lambda console: render(console, rows))
    return 0


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| op | kind | family | front ends |", "|---|---|---|---|"]
    lines += [f"| `{r['op']}` | {r['kind']} | {r['family']} | {', '.join(r['frontends'])} |" for r in rows]
    return "\n".join(lines)


def render(console: Console, rows: list[dict[str, Any]]) -> None:
    table = Table(title=f"{len(rows)} supported ops", title_justify="left")
    for col in ("op", "kind", "family", "front ends"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["op"], r["kind"], r["family"], ", ".join(r["frontends"]))
    console.print(table)

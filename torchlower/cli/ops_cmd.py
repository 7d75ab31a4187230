"""``torchlower ops [--grep PATTERN] [--markdown]``: the support table, read from the rule registry itself."""

from __future__ import annotations

import argparse
import re
from typing import Any

from rich.console import Console
from rich.table import Table

from torchlower.cli.console import Output
from torchlower.cli.failures import usage_error


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "ops",
        parents=[common],
        help="list supported ops: ATen name, family, front ends",
        description="Every registered lowering rule: ATen ops (seen by every front end), Python"
        " functions and whole modules (seen by the fx front end).",
    )
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")
    p.add_argument(
        "--grep",
        metavar="PATTERN",
        help="only ops whose name or family matches PATTERN (a case-insensitive regular expression)",
    )
    p.set_defaults(run=run)


def support_table() -> list[dict[str, Any]]:
    """One row per rule proven in tract by a test, sorted by family then name."""
    from torchlower.rules.coverage import support_rows

    return support_rows()


def run(args: argparse.Namespace, out: Output) -> int:
    rows = support_table()
    if args.grep is not None:
        rows = _matching(rows, args.grep)
    if args.markdown and not args.json and args.grep is None:
        print(markdown(rows), end="")
        return 0
    data = {"ok": True, "count": len(rows), "ops": rows}
    out.emit(data, lambda console: render(console, rows))
    return 0


def _matching(rows: list[dict[str, Any]], pattern: str) -> list[dict[str, Any]]:
    try:
        found = re.compile(pattern, re.IGNORECASE)
    except re.error as exc:
        raise usage_error(f"--grep {pattern!r}: not a regular expression ({exc})") from None
    return [r for r in rows if found.search(r["op"]) or found.search(r["family"])]


def markdown(rows: list[dict[str, Any]]) -> str:
    from torchlower.rules.coverage import markdown as generate

    return generate()


def render(console: Console, rows: list[dict[str, Any]]) -> None:
    table = Table(title=f"{len(rows)} supported ops", title_justify="left")
    if not rows:
        console.print("no supported op matches (`torchlower ops` lists them all)")
        return
    for col in ("op", "kind", "family", "front ends"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["op"], r["kind"], r["family"], ", ".join(r["frontends"]))
    console.print(table)

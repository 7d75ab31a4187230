"""Argument parsing, dispatch, exit codes and error printing for ``torchlower``."""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from torchlower.cli import check_cmd, export_cmd, inspect_cmd, llm_cmd, ops_cmd, run_cmd
from torchlower.cli.console import Output, setup_logging
from torchlower.cli.failures import BAD_INPUT, describe, short, usage_error

EPILOG = (
    "exit codes: 0 ok, 1 check mismatch, 2 bad usage or input, 3 unsupported ops.\n"
    "docs: README.md and docs/ (getting-started, troubleshooting) in the torchlower source."
)


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so usage errors print like every other error."""

    def error(self, message: str) -> NoReturn:
        raise usage_error(f"{self.prog}: {message}", f"`{self.prog} --help` shows the usage.")


def build_parser() -> argparse.ArgumentParser:
    from torchlower import __version__

    common = _Parser(add_help=False)
    common.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    common.add_argument("-q", "--quiet", action="store_true", help="no progress, no result text")
    common.add_argument("-v", "--verbose", action="count", default=0, help="more log lines (-vv: debug)")
    common.add_argument("--debug", action="store_true", help="show tracebacks")
    parser = _Parser(
        prog="torchlower",
        description="Lower PyTorch modules to verified NNEF archives (run by tract); read them back.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"torchlower {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    export_cmd.add_parser(sub, common)
    check_cmd.add_parser(sub, common)
    run_cmd.add_parser(sub, common)
    inspect_cmd.add_parser(sub, common)
    ops_cmd.add_parser(sub, common)
    llm_cmd.add_parser(sub, common)
    demo = sub.add_parser(
        "demo", parents=[common], help="export a small CNN, run it in tract, print the table"
    )
    demo.add_argument("-o", "--output", help="keep the archive at this path")
    demo.set_defaults(run=_demo)
    return parser


def _demo(args: argparse.Namespace, out: Output) -> int:
    from torchlower.cli.demo import main as demo_main

    return int(demo_main(args.output))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    out = Output(json="--json" in argv, quiet="--quiet" in argv or "-q" in argv)
    debug = "--debug" in argv
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "run", None) is None:
            build_parser().print_help(sys.stderr)
            return BAD_INPUT
        out = Output(json=args.json, quiet=args.quiet)
        setup_logging(args.verbose, args.quiet)
        return int(args.run(args, out))
    except KeyboardInterrupt:
        sys.stderr.write("torchlower: interrupted\n")
        return 130
    except Exception as exc:
        return report_failure(exc, out, debug)


def report_failure(exc: BaseException, out: Output, debug: bool) -> int:
    """Print one paragraph (and the traceback with --debug); JSON on stdout with --json."""
    data = describe(exc)
    if debug:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    if out.json:
        out.emit(data, lambda _console: None)
    err = data["error"]
    lines = [f"error: {err['message']}"]
    for e in data.get("outputs", []):
        mark = "ok" if e["ok"] else "MISMATCH"
        lines.append(
            f"  {e['name']}: max abs {short(e['max_abs'])} (rel {short(e['max_rel'])}),"
            f" tolerance {short(e['tolerance'])}  {mark}"
        )
    lines.append(f"hint: {err['hint']}")
    if not debug:
        lines.append("(--debug shows the traceback)")
    sys.stderr.write("\n".join(lines) + "\n")
    return int(data["exit_code"])

"""Terminal side of the CLI: results on stdout (text or JSON), logs and progress on stderr.

Progress bars appear only when stderr is a terminal, ``--quiet`` is off and a stage lasts
longer than ``TORCHLOWER_PROGRESS_DELAY`` seconds (default 0.5), so quick runs and pipes stay
clean.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn

from torchlower.core import progress


@dataclass
class Output:
    """Where a command's result goes: JSON on stdout, or rich text unless quiet."""

    json: bool = False
    quiet: bool = False
    stdout: Console = field(default_factory=lambda: _console(sys.stdout))
    stderr: Console = field(default_factory=lambda: _console(sys.stderr))

    def emit(self, data: dict[str, Any], render: Callable[[Console], None]) -> None:
        if self.json:
            sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False, default=str) + "\n")
            sys.stdout.flush()
        elif not self.quiet:
            render(self.stdout)

    def reporter(self) -> RichReporter | None:
        """A progress display on stderr, or None when it would only get in the way."""
        if self.quiet or os.environ.get("TORCHLOWER_PROGRESS", "") == "0" or not sys.stderr.isatty():
            return None
        delay = float(os.environ.get("TORCHLOWER_PROGRESS_DELAY", "0.5"))
        return RichReporter(self.stderr, delay)


def _console(stream: Any) -> Console:
    wide = None if stream.isatty() else 110  # piped output is not wrapped at 80 columns
    return Console(file=stream, highlight=False, width=wide, soft_wrap=False)


def setup_logging(verbose: int, quiet: bool) -> None:
    """The library logs under ``torchlower``; show warnings (``-v`` info, ``-vv`` debug)."""
    logger = logging.getLogger("torchlower")
    level = logging.ERROR if quiet else (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    logger.setLevel(level)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_LowerLevel("torchlower: %(levelname)s: %(message)s"))
    logger.handlers[:] = [handler]
    logger.propagate = False
    import warnings

    if quiet:
        warnings.simplefilter("ignore")
    elif verbose == 0:  # upstream deprecation chatter is not the user's business here
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)


class _LowerLevel(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        record = logging.makeLogRecord(record.__dict__)
        record.levelname = record.levelname.lower()
        return super().format(record)


class RichReporter:
    """``torchlower.core.progress.Reporter`` drawing rich bars: ops done / total, bytes and rate."""

    def __init__(self, console: Console, delay: float) -> None:
        self.bars = Progress(
            SpinnerColumn(),
            TextColumn("{task.description:<18}"),
            BarColumn(bar_width=30),
            TextColumn("{task.fields[detail]}"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.delay = delay
        self.stack: list[tuple[TaskID, str, float]] = []  # task, unit, start time
        self.timer: threading.Timer | None = None
        self.shown = False

    def start(self, name: str, total: float | None, unit: str) -> None:
        task = self.bars.add_task(name, total=total, detail="")
        self.stack.append((task, unit, time.monotonic()))
        if not self.shown and self.timer is None:
            self.timer = threading.Timer(self.delay, self._show)
            self.timer.daemon = True
            self.timer.start()
        self._refresh()

    def advance(self, amount: float) -> None:
        if self.stack:
            self.bars.advance(self.stack[-1][0], amount)
            self._refresh()

    def retotal(self, total: float | None, name: str | None) -> None:
        if self.stack:
            task = self.stack[-1][0]
            self.bars.update(task, total=total, **({"description": name} if name else {}))
            self._refresh()

    def finish(self) -> None:
        if self.stack:
            task, _, _ = self.stack.pop()
            self.bars.remove_task(task)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        if self.shown:
            self.bars.stop()

    def _show(self) -> None:
        self.shown = True
        self.bars.start()

    def _refresh(self) -> None:
        task_id, unit, started = self.stack[-1]
        task = self.bars.tasks[[t.id for t in self.bars.tasks].index(task_id)]
        done, total = task.completed, task.total
        if unit == "bytes":
            rate = done / max(time.monotonic() - started, 1e-6)
            of = f" / {_bytes(total)}" if total else ""
            detail = f"{_bytes(done)}{of}  {_bytes(rate)}/s"
        elif unit:
            detail = f"{int(done)}{f' / {int(total)}' if total else ''} {unit}"
        else:
            detail = ""
        self.bars.update(task_id, detail=detail)


def _bytes(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


class show_progress:  # lower case: used as a context manager, reads like one
    """``with show_progress(out):`` routes library progress to a rich display (or nowhere)."""

    def __init__(self, out: Output) -> None:
        self.reporter = out.reporter()
        self._ctx = progress.reporting(self.reporter)

    def __enter__(self) -> None:
        self._ctx.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)  # type: ignore[arg-type]
        if self.reporter is not None:
            self.reporter.close()

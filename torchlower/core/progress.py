"""Progress hooks: the library marks stages and steps, a front-end (the CLI) may display them.

The library never prints. It calls ``stage(...)`` / ``advance(...)`` / ``retotal(...)``, which
do nothing unless a caller installed a ``Reporter`` with ``reporting(...)``. The reporter lives
in a context variable, so concurrent exports in other threads or tasks are unaffected.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Reporter(Protocol):
    """What a display implements; every call is cheap and must not raise."""

    def start(self, name: str, total: float | None, unit: str) -> None: ...

    def advance(self, amount: float) -> None: ...

    def retotal(self, total: float | None, name: str | None) -> None: ...

    def finish(self) -> None: ...


_current: contextvars.ContextVar[Reporter | None] = contextvars.ContextVar(
    "torchlower_progress", default=None
)


@contextmanager
def reporting(reporter: Reporter | None) -> Iterator[None]:
    """Send progress of the code run inside the block to ``reporter`` (``None``: silence)."""
    token = _current.set(reporter)
    try:
        yield
    finally:
        _current.reset(token)


@contextmanager
def stage(name: str, total: float | None = None, unit: str = "") -> Iterator[None]:
    """Mark a stage (``"lowering"``, ``"writing"``); ``total`` in ``unit`` if known."""
    reporter = _current.get()
    if reporter is None:
        yield
        return
    reporter.start(name, total, unit)
    try:
        yield
    finally:
        reporter.finish()


def advance(amount: float = 1) -> None:
    """``amount`` more units of the current stage are done."""
    reporter = _current.get()
    if reporter is not None:
        reporter.advance(amount)


def retotal(total: float | None, name: str | None = None) -> None:
    """The current stage's total became known (and it may be renamed, e.g. tracing → lowering)."""
    reporter = _current.get()
    if reporter is not None:
        reporter.retotal(total, name)

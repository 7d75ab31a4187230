"""The CLI's own entry point (``torchlower.cli.main``) called in this process, as a subprocess
would run it but without its imports (~3 s each); ``tests/test_cli.py`` keeps the subprocess
smoke tests of ``python -m torchlower``."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import warnings
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Ran:
    """Exit code, stdout and stderr of one command."""

    returncode: int
    stdout: str
    stderr: str

    def json(self) -> dict[str, Any]:
        assert self.returncode == 0, self.stderr[-3000:]
        return json.loads(self.stdout)


def run(*args: Any) -> Ran:
    """``torchlower ARGS`` in process; the logging and warning setup it changes is restored."""
    from torchlower.cli.main import main

    logger = logging.getLogger("torchlower")
    kept = (logger.handlers[:], logger.propagate, logger.level)
    out, err = io.StringIO(), io.StringIO()
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main([str(a) for a in args])
    finally:
        logger.handlers[:], logger.propagate, _ = kept
        logger.setLevel(kept[2])
    return Ran(code, out.getvalue(), err.getvalue())


def run_json(*args: Any) -> dict[str, Any]:
    """``torchlower ARGS --json`` in process, which must succeed."""
    return run(*args, "--json").json()

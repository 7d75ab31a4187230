"""torch's own output during a front-end attempt goes to the ``torchlower`` debug log.

When ``torch.export`` fails on a data-dependent branch it prints the partial FX graph to
``sys.stderr`` (``torch/export/_trace.py``), and its ``symbolic_shapes`` / dynamo loggers write
``W1201 …`` lines, some with ANSI colours. Under ``frontend="auto"`` that failure is expected —
torchlower falls back to the next front end — so the user should see the fallback note, not a
page of graph listing. Inside ``torch_output_to_debug_log()`` both go to ``log.debug`` (ANSI
escapes removed); ``-vv`` on the command line shows them.
"""

from __future__ import annotations

import contextlib
import io
import logging
import re
from collections.abc import Iterator

log = logging.getLogger("torchlower")
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
TORCH_LOGGERS = ("torch", "torch._dynamo", "torch.fx.experimental.symbolic_shapes", "torch.export")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


class _ToDebug(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        log.debug("%s: %s", record.name, strip_ansi(record.getMessage()))


@contextlib.contextmanager
def torch_output_to_debug_log(what: str) -> Iterator[None]:
    """Route torch's stderr prints and log records made inside the block to ``log.debug``."""
    saved = []
    handler = _ToDebug()
    for name in TORCH_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.handlers[:], logger.propagate))
        logger.handlers[:] = [handler]
        logger.propagate = False
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stderr(buffer):
            yield
    finally:
        for logger, handlers, propagate in saved:
            logger.handlers[:] = handlers
            logger.propagate = propagate
        text = strip_ansi(buffer.getvalue()).strip()
        if text:
            log.debug("torch printed during %s:\n%s", what, text)

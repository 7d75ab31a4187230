"""``@torch.jit.script_if_tracing`` helpers traced through as Python under ``torch.jit.trace``.

The decorator (torch's, and the copies asteroid and asteroid-filterbanks ship) scripts the
helper when it is first called during a trace, so the trace holds a scripted graph: its nodes
carry no shapes (a script is not specialized to the example), which rules need, and its
branches cannot follow a dynamic axis. The jit front end specializes to the example anyway and
finds branches on sizes by tracing at several sizes, so while it traces, ``torch.jit.script``
of a plain function returns the function itself and the tracer records the ops the example
runs, with their shapes. Modules and classes are still scripted.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch
import torch.jit._trace


@contextlib.contextmanager
def helpers_traced() -> Iterator[None]:
    """``torch.jit.script(fn)`` of a Python function during a trace is ``fn``, for the duration."""
    public, traced = torch.jit.script, torch.jit._trace.script

    def script(obj: Any, *args: Any, **kwargs: Any) -> Any:
        if inspect.isfunction(obj) and torch._C._is_tracing():
            return obj
        return public(obj, *args, **kwargs)

    torch.jit.script = torch.jit._trace.script = script  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.jit.script, torch.jit._trace.script = public, traced  # type: ignore[assignment]

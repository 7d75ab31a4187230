"""Turning an exception into an exit code and one clean paragraph with a hint.

Exit codes: 0 ok, 1 check mismatch (or tract could not run the artifact), 2 bad usage or input,
3 unsupported ops (no rule, or a rule that cannot honour an argument).
"""

from __future__ import annotations

import math
from typing import Any

from torchlower.errors import (
    ArtifactError,
    CheckError,
    InvalidArgumentError,
    LoweringError,
    TorchlowerError,
    TraceError,
    UnsupportedOpsError,
)

OK, MISMATCH, BAD_INPUT, UNSUPPORTED = 0, 1, 2, 3
TROUBLESHOOTING = "docs/troubleshooting.md"

_HINTS: list[tuple[type[BaseException], str]] = [
    (
        UnsupportedOpsError,
        "`torchlower ops` lists the supported ops; another --frontend may see different ops, or"
        " register a rule for the missing ones (docs/extending.md).",
    ),
    (
        LoweringError,
        "the op has a rule but not for these arguments; change the model call, try another"
        " --frontend, or register your own rule (docs/extending.md).",
    ),
    (
        TraceError,
        "this front end could not capture the model; try another with --frontend jit|fx|export"
        " (docs/frontends.md says which fits what).",
    ),
    (
        ArtifactError,
        "the file is not a valid NNEF / lattice artifact or is damaged; export it again.",
    ),
    (
        InvalidArgumentError,
        "check the option or value named above; `torchlower COMMAND --help` shows the accepted forms.",
    ),
]


def usage_error(message: str, hint: str | None = None) -> InvalidArgumentError:
    """A bad-usage error carrying its own hint (shown instead of the class hint)."""
    exc = InvalidArgumentError(message)
    exc.hint = hint  # type: ignore[attr-defined]
    return exc


def exit_code(exc: BaseException) -> int:
    if isinstance(exc, CheckError):
        return MISMATCH
    if isinstance(exc, (UnsupportedOpsError, LoweringError)):
        return UNSUPPORTED
    return BAD_INPUT


def hint(exc: BaseException) -> str:
    own = getattr(exc, "hint", None)
    if own:
        return str(own)
    if isinstance(exc, CheckError):
        if getattr(exc, "errors", None):
            return (
                "the artifact runs but its outputs differ from the reference; compare the inputs and"
                f" expected outputs, or see {TROUBLESHOOTING} (CheckError)."
            )
        return f"tract could not run the artifact; see {TROUBLESHOOTING} (CheckError)."
    for kind, text in _HINTS:
        if isinstance(exc, kind):
            return text
    return "run again with --debug to see the traceback."


def message(exc: BaseException) -> str:
    text = str(exc).strip() or repr(exc)
    if not isinstance(exc, TorchlowerError):
        text = f"{type(exc).__name__}: {text}"
    notes = getattr(exc, "__notes__", None) or []  # e.g. why the auto front end skipped others
    return "\n".join([text, *(f"  note: {n}" for n in notes)])


def describe(exc: BaseException) -> dict[str, Any]:
    """The JSON form of a failure (also what the text form is printed from)."""
    data: dict[str, Any] = {
        "ok": False,
        "exit_code": exit_code(exc),
        "error": {"type": type(exc).__name__, "message": message(exc), "hint": hint(exc)},
    }
    if isinstance(exc, UnsupportedOpsError):
        data["unsupported_ops"] = [{"op": o.op, "count": o.count, "first_use": o.first_use} for o in exc.ops]
    if isinstance(exc, CheckError) and getattr(exc, "errors", None):
        data["outputs"] = [output_error(e) for e in exc.errors]
    return data


def output_error(e: Any) -> dict[str, Any]:
    """One per-output comparison as JSON (infinite errors become the string "inf")."""
    return {
        "name": e.name,
        "max_abs": _number(e.max_abs),
        "max_rel": _number(e.max_rel),
        "tolerance": _number(e.tolerance),
        "ok": bool(e.ok),
        "note": getattr(e, "note", None),  # the float64 judge's / tie groups' finding, if any
    }


def _number(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def short(x: float | str) -> str:
    """A number for people: 3 significant digits (``"inf"`` stays as is)."""
    return f"{x:.3g}" if isinstance(x, (int, float)) else str(x)

"""One exception hierarchy: every failure a user can meet is a ``TorchlowerError``.

Messages name the culprit (op, module path, argument, file) and what was expected, so a
user can act without reading a traceback.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class TorchlowerError(Exception):
    """Base class of every error torchlower raises on purpose."""


class InvalidArgumentError(TorchlowerError, ValueError):
    """A call to the public API got an argument it cannot use."""


class TraceError(TorchlowerError):
    """A front end could not capture the model's graph (tracing / export failed)."""


class ValueDependentTraceError(TraceError):
    """The graph would depend on tensor values (a branch, loop count or scale taken from a
    tensor into Python); the message names the model's source line and how to rewrite it."""


class LoweringError(TorchlowerError):
    """A rule exists but cannot honour the arguments it was given."""


class DynamicAxisError(LoweringError):
    """A size declared dynamic cannot stay symbolic; the message names input, axis, op and line,
    and the fix is usually an argument (bounds, or a static axis), not a change to the model."""


@dataclass(frozen=True)
class UnsupportedOp:
    """One operator without a rule: how often it appears and where it is first used."""

    op: str
    count: int
    first_use: str


class UnsupportedOpsError(TorchlowerError):
    """The model uses operators without a lowering rule; lists all of them at once."""

    def __init__(self, ops: Sequence[UnsupportedOp], frontend: str = "", registry: str = "") -> None:
        self.ops = list(ops)
        self.frontend = frontend
        self.registry = registry  # "lattice": the rules of torchlower.lattice, not the NNEF ones
        lines = [f"  - {o.op} ×{o.count} (first used at {o.first_use or '<top level>'})" for o in self.ops]
        where = f" ({frontend} front end)" if frontend else ""
        rules = f"a {registry} lowering rule" if registry else "a lowering rule"
        api = f"torchlower.{registry}" if registry else "torchlower"
        super().__init__(
            f"{len(self.ops)} unsupported op(s){where}; every one needs {rules}:\n"
            + "\n".join(lines)
            + f"\nRegister one with {api}.register_function_rule / register_module_rule."
        )


class CheckError(TorchlowerError):
    """The artifact ran but its outputs differ from PyTorch beyond tolerance, or it failed to run."""

    def __init__(self, message: str, errors: Sequence[object] = ()) -> None:
        self.errors = list(errors)
        super().__init__(message)


class ArtifactError(TorchlowerError):
    """An artifact (archive, .dat, graph text, lattice folder) is malformed or unsafe."""


class StreamingError(LoweringError):
    """A model cannot run as a stream over its streaming axis (tract cannot pulse an op, or an
    op needs the whole sequence); the message names the op, its module path and why."""


class InvalidPulseError(StreamingError, InvalidArgumentError):
    """A pulse the model's strides do not allow; the message lists the valid pulses."""

"""torchlower: lower PyTorch modules into portable, verified inference artifacts.

Heavy modules (torch, the front ends) load on first use, so ``import torchlower`` stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = [
    "Artifact",
    "CheckResult",
    "ExportReport",
    "check",
    "errors",
    "export",
    "inspect",
    "load",
    "register_function_rule",
    "register_module_rule",
]

if TYPE_CHECKING:
    from torchlower.artifact.io import Artifact, CheckResult, check, inspect, load
    from torchlower.pipeline.export import ExportReport, export

from torchlower import _moved

_moved.install()  # old import paths (torchlower.io, torchlower.api, …) for one release


def __dir__() -> list[str]:
    """The public API (resolved lazily by ``__getattr__``), not the helpers of this file."""
    return sorted({*__all__, *(n for n in globals() if n.startswith("__"))})


def __getattr__(name: str) -> Any:
    if name in ("export", "ExportReport"):
        from torchlower.pipeline import export

        return getattr(export, name)
    if name in ("load", "inspect", "check", "Artifact", "CheckResult"):
        from torchlower.artifact import io

        return getattr(io, name)
    if name == "register_function_rule":
        from torchlower.rules import NNEF_RULES

        return NNEF_RULES.function
    if name == "register_module_rule":
        from torchlower.rules import NNEF_RULES

        return NNEF_RULES.module
    if name in ("errors", "jit", "fx", "lattice", "nnef", "rules"):
        import importlib

        return importlib.import_module(f"torchlower.{name}")
    raise AttributeError(f"module 'torchlower' has no attribute {name!r}")

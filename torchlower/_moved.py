"""Import paths that moved when the package was grouped by layer (issue 27).

``import torchlower.io`` keeps working for one release: it returns the module at its new path
(the same module object, so private names and monkeypatching still reach the code that runs)
and warns with a ``DeprecationWarning`` naming the new path. ``torchlower.jit`` and
``torchlower.fx`` are public front-end APIs and stay without a warning.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import CodeType, ModuleType

MOVED = {
    "torchlower.api": "torchlower.pipeline.export",
    "torchlower.validate": "torchlower.pipeline.validate",
    "torchlower.verification": "torchlower.pipeline.verification",
    "torchlower.io": "torchlower.artifact.io",
    "torchlower.runner": "torchlower.artifact.runner",
    "torchlower.model_check": "torchlower.artifact.model_check",
    "torchlower.values": "torchlower.core.values",
    "torchlower.dtypes": "torchlower.core.dtypes",
    "torchlower.tolerance": "torchlower.core.tolerance",
    "torchlower.progress": "torchlower.core.progress",
    "torchlower.dynamic": "torchlower.core.dynamic",
    "torchlower.dynamic_shapes": "torchlower.core.dynamic_shapes",
    "torchlower.dynamic_sizes": "torchlower.core.dynamic_sizes",
    "torchlower.model_io": "torchlower.core.model_io",
    "torchlower.coverage": "torchlower.rules.coverage",
    "torchlower.demo": "torchlower.cli.demo",
}
PUBLIC = {"torchlower.jit": "torchlower.frontends.jit", "torchlower.fx": "torchlower.frontends.fx"}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path and loads it as the module at its new path."""

    def find_spec(
        self, name: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if name in MOVED or name in PUBLIC:
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = MOVED.get(spec.name) or PUBLIC[spec.name]
        if spec.name in MOVED:
            warnings.warn(
                f"{spec.name} moved to {new}; the old path goes in the next release",
                DeprecationWarning,
                stacklevel=2,
            )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: ``create_module`` returned the loaded module."""

    def get_code(self, name: str) -> CodeType | None:
        """The new module's code, so ``python -m torchlower.demo`` still runs it."""
        new = MOVED.get(name) or PUBLIC[name]
        spec = importlib.util.find_spec(new)
        loader = spec.loader if spec is not None else None
        return loader.get_code(new) if isinstance(loader, importlib.abc.InspectLoader) else None


def install() -> None:
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.append(_Alias())

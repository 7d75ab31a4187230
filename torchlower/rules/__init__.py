"""Lowering rules, grouped by op family (one module per family).

Importing this package is cheap: the family modules load on the first rule lookup, so every
``*.py`` here (except ``registry`` and ``common``) is discovered without a hand-kept list.
"""

from __future__ import annotations

import importlib
import pkgutil

from torchlower.rules.registry import Registry

NNEF_RULES = Registry("NNEF")
rule = NNEF_RULES.function
module_rule = NNEF_RULES.module

_NOT_FAMILIES = {"registry", "common", "coverage"}


def _load_families() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        if info.name not in _NOT_FAMILIES:
            importlib.import_module(f"{__name__}.{info.name}")


NNEF_RULES.on_first_lookup(_load_families)

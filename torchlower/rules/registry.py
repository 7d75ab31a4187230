"""The rule registry: one lowering rule per op, shared by every front end.

Rules are keyed by ATen name (``"aten::conv2d"``), by Python callable (FX function targets
mapped onto the ATen rule) or by module type (whole-module lowerings). A key registered
twice is an error, so user rules never silently shadow built-in ones.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torchlower.errors import InvalidArgumentError

RuleFn = Callable[..., Any]


@dataclass(frozen=True)
class Rule:
    """A registered lowering: ``fn(builder, *args)`` with args in ATen schema order."""

    key: object
    fn: RuleFn
    family: str


class Registry:
    """Rules for one builder family (NNEF, lattice); the builder carries its registry."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.functions: dict[object, Rule] = {}
        self.modules: dict[type, Rule] = {}
        self._loaded_families: Callable[[], None] | None = None

    # ---- registration -------------------------------------------------------------------
    def function(self, *keys: object) -> Callable[[RuleFn], RuleFn]:
        """Decorator: register ``fn`` for ATen names (``"aten::relu"``) or Python callables."""

        def register(fn: RuleFn) -> RuleFn:
            for key in keys:
                key = normalize_key(key)
                if key in self.functions:
                    raise InvalidArgumentError(
                        f"a {self.name} rule for {describe(key)} is already registered "
                        f"({self.functions[key].fn.__module__}.{self.functions[key].fn.__qualname__})"
                    )
                self.functions[key] = Rule(key, fn, fn.__module__.rsplit(".", 1)[-1])
            return fn

        return register

    def module(self, *types: type) -> Callable[[RuleFn], RuleFn]:
        """Decorator: register ``fn(builder, module, *inputs)`` for whole modules of ``types``."""

        def register(fn: RuleFn) -> RuleFn:
            for module_type in types:
                if module_type in self.modules:
                    raise InvalidArgumentError(
                        f"a {self.name} module rule for {module_type.__qualname__} is already registered"
                    )
                self.modules[module_type] = Rule(module_type, fn, fn.__module__.rsplit(".", 1)[-1])
            return fn

        return register

    # ---- lookup -------------------------------------------------------------------------
    def lookup_function(self, key: object) -> Rule | None:
        """The rule for ``key``; an overload (``aten::to.dtype``) falls back to its op."""
        self.ensure_loaded()
        key = normalize_key(key)
        rule = self.functions.get(key)
        if rule is None and isinstance(key, str) and "." in key:
            rule = self.functions.get(key.split(".", 1)[0])
        return rule

    def lookup_module(self, module_type: type) -> Rule | None:
        """The rule of ``module_type`` or of its nearest base class (by MRO)."""
        self.ensure_loaded()
        for cls in module_type.__mro__:
            if cls in self.modules:
                return self.modules[cls]
        return None

    def on_first_lookup(self, loader: Callable[[], None]) -> None:
        """Defer importing the built-in rule families until a rule is first needed."""
        self._loaded_families = loader

    def ensure_loaded(self) -> None:
        loader, self._loaded_families = self._loaded_families, None
        if loader is not None:
            loader()


def normalize_key(key: object) -> object:
    """``aten.relu.default`` / ``aten::relu`` / ``"relu"`` all name the same ATen rule."""
    if isinstance(key, str):
        return key if "::" in key else f"aten::{key}"
    if hasattr(key, "overloadpacket") and hasattr(key, "name"):  # torch OpOverload
        return key.name()
    for attr in ("_qualified_op_name", "_qualname"):  # torch OpOverloadPacket / custom_op's CustomOpDef
        qualified = getattr(key, attr, None)
        if isinstance(qualified, str) and "::" in qualified:
            return qualified
    return key


def describe(key: object) -> str:
    if isinstance(key, str):
        return key
    module = getattr(key, "__module__", None) or ""
    name = getattr(key, "__qualname__", None) or getattr(key, "__name__", None) or repr(key)
    return f"{module}.{name}" if module else str(name)

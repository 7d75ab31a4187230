"""What every front end shares: applying rules, folding constants, collecting what is missing.

A front end translates its graph into ``session.apply(key, args, where, meta)`` calls. The
session looks the rule up, folds calls whose inputs are all constants (so shapes, ``arange``
of static sizes and scalar math leave no ops behind), records unsupported ops without
stopping, and stamps results with the dtype/shape the front end observed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from torchlower.core import progress
from torchlower.core.dynamic_sizes import scalar_op
from torchlower.core.values import MISSING, Missing, Shape, Value, constant
from torchlower.errors import LoweringError, TorchlowerError, UnsupportedOp, UnsupportedOpsError
from torchlower.rules.registry import describe, normalize_key

Meta = tuple[torch.dtype | None, Shape | None]

# ops whose result is not a function of their inputs: never fold them
_NOT_FOLDABLE = {
    "rand",
    "randn",
    "randint",
    "rand_like",
    "randn_like",
    "bernoulli",
    "normal",
    "dropout",
    "feature_dropout",
    "alpha_dropout",
    "empty",
    "empty_like",
    "uniform",
}


@dataclass
class Session:
    builder: Any
    frontend: str
    missing: Counter[str] = field(default_factory=Counter)
    first_use: dict[str, str] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)  # registered keys of the rules that ran
    # (old, new) values of tensors a call wrote in place (export of an FX-wrapped function)
    writes: list[tuple[Any, Any]] = field(default_factory=list)
    scope: str | None = None  # module path of the current node, when `where` is not one (FX)
    location: str | None = None  # "block.1 (model.py:12)" for errors, when the front end knows it

    def apply(
        self,
        key: object,
        args: Sequence[Any],
        where: str,
        metas: Sequence[Meta] | None = None,
        fold: Callable[..., Any] | None = None,
    ) -> Any:
        """Lower one call; returns Value(s), Python objects (folded scalars) or MISSING."""
        progress.advance()
        sized = scalar_op(str(normalize_key(key)).split("::")[-1].split(".")[0], args)
        if sized is not NotImplemented:  # integer math on symbolic sizes (dynamic axes) stays symbolic
            return sized
        rule = self.builder.rules.lookup_function(key)
        if _contains(args, Missing):  # downstream of a missing op: only note our own absence
            if rule is None:
                self.record_missing(describe(normalize_key(key)), where)
            return MISSING
        if fold is not None and _foldable(key, args):
            folded = _try_fold(fold, args, inplace=_is_inplace(key))
            if folded is not _FAILED:
                return _wrap_constants(folded)
        if rule is None:
            self.record_missing(describe(normalize_key(key)), where)
            return MISSING
        if _contains_complex(args) and not getattr(rule.fn, "complex_aware", False):
            return self._complex(key, args, where, metas)
        self.used.add(describe(rule.key))
        return self.invoke(rule.fn, describe(normalize_key(key)), args, where, metas)

    def _complex(self, key: object, args: Sequence[Any], where: str, metas: Sequence[Meta] | None) -> Any:
        """A call with a complex operand: only rules that read the ``[re, im]`` layout may run
        (``rules/complex_parts.py``); any other is reported, never fed a complex tensor."""
        from torchlower.rules.complex_parts import COMPLEX_OVERRIDES

        name = describe(normalize_key(key))
        fn = COMPLEX_OVERRIDES.get(name.split("::")[-1].split(".")[0])
        if fn is None:
            self.record_missing(f"{name} (on a complex tensor)", where)
            return MISSING
        return self.invoke(fn, name, args, where, metas)

    def apply_module(
        self, module: Any, args: Sequence[Any], where: str, metas: Sequence[Meta] | None = None
    ) -> Any:
        """Lower a whole module with its module rule ``fn(builder, module, *inputs)``."""
        rule = self.builder.rules.lookup_module(type(module))
        if rule is None:
            self.record_missing(describe(type(module)), where)
            return MISSING
        if _contains(args, Missing):
            return MISSING
        self.used.add(describe(rule.key))
        return self.invoke(rule.fn, describe(type(module)), [module, *args], where, metas)

    def invoke(self, fn: Callable[..., Any], op: str, args: Sequence[Any], where: str, metas: Any) -> Any:
        """Call a rule; its unexpected failures become ``LoweringError`` naming op and place."""
        self.builder.hint = where.replace(".", "_") or "v"
        self.builder.scope = self.scope if self.scope is not None else where
        try:
            result = fn(self.builder, *args)
        except TorchlowerError as exc:
            if type(exc) is not LoweringError or getattr(exc, "located", False):
                raise  # typed errors of their own (unsupported ops, dynamic axes) say where already
            place = self.location or where or "<top level>"
            located = LoweringError(f"{op} at {place}: {exc}")
            located.located = True  # type: ignore[attr-defined]  # an enclosing rule adds nothing
            raise located from exc
        except (TypeError, ValueError, IndexError, NotImplementedError) as exc:
            place = self.location or where or "<top level>"
            raise LoweringError(f"rule for {op} failed at {place}: {exc}") from exc
        return stamp(result, metas)

    def record_missing(self, op: str, where: str) -> None:
        self.missing[op] += 1
        self.first_use.setdefault(op, self.location or where)

    def finish(self) -> None:
        """Raise one error listing every unsupported op, if any."""
        if self.missing:
            ops = [UnsupportedOp(op, n, self.first_use[op]) for op, n in sorted(self.missing.items())]
            raise UnsupportedOpsError(ops, self.frontend)


def stamp(result: Any, metas: Sequence[Meta] | None) -> Any:
    """Attach observed dtype/shape to the rule's result(s); constants keep their own."""
    if not metas:
        return result
    if isinstance(result, Value):
        return result if result.is_const else result.with_meta(*metas[0])
    if isinstance(result, (tuple, list)) and len(result) == len(metas):
        return type(result)(
            r.with_meta(*m) if isinstance(r, Value) and not r.is_const else r
            for r, m in zip(result, metas, strict=True)
        )
    return result


_FAILED = object()


def _foldable(key: object, args: Sequence[Any]) -> bool:
    name = str(normalize_key(key)).split("::")[-1]
    if name in _NOT_FOLDABLE:
        return False
    return not _contains(args, Value, only_non_const=True)


def _is_inplace(key: object) -> bool:
    name = str(normalize_key(key)).split("::")[-1].split(".")[0]
    return name.endswith("_") and not name.endswith("__")


def _try_fold(fold: Callable[..., Any], args: Sequence[Any], inplace: bool = False) -> Any:
    """``fold(*args)`` on the constants' tensors; an in-place op works on a copy of its target,
    which may be a model's buffer or a view of one (the front end writes the result back)."""
    unwrapped = [_unwrap(a) for a in args]
    if inplace and unwrapped and isinstance(unwrapped[0], torch.Tensor):
        unwrapped[0] = unwrapped[0].clone()
    try:
        with torch.no_grad():
            return fold(*unwrapped)
    except Exception:  # folding is an optimisation: the rule handles what torch refuses
        return _FAILED


def _unwrap(arg: Any) -> Any:
    if isinstance(arg, Value):
        return arg.const
    if isinstance(arg, (list, tuple)):
        return type(arg)(_unwrap(a) for a in arg)
    return arg


def _wrap_constants(result: Any) -> Any:
    if isinstance(result, torch.Tensor):
        return constant(result)
    if isinstance(result, (list, tuple)):
        return type(result)(_wrap_constants(r) for r in result)
    return result


def _contains_complex(args: Any) -> bool:
    if isinstance(args, complex):  # a Python complex scalar (``x * 1j``) makes the result complex
        return True
    if isinstance(args, Value):
        return args.dtype is not None and args.dtype.is_complex
    if isinstance(args, (list, tuple)):
        return any(_contains_complex(a) for a in args)
    return False


def _contains(args: Any, kind: type, only_non_const: bool = False) -> bool:
    if isinstance(args, kind):
        return not (only_non_const and isinstance(args, Value) and args.is_const)
    if isinstance(args, (list, tuple)):
        return any(_contains(a, kind, only_non_const) for a in args)
    if isinstance(args, dict):
        return any(_contains(a, kind, only_non_const) for a in args.values())
    return False

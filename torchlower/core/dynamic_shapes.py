"""``dynamic_shapes`` as users write them for ``torch.export``, read as torchlower's ``dynamic_axes``.

torch.export binds ``dynamic_shapes`` to ``forward``'s signature: a dict by parameter name or
a tuple by parameter, where a ``*args`` parameter takes one nested tuple with an entry per
tensor (``{"xs": ({0: B}, {0: B})}`` or ``(({0: B}, {0: B}),)``). torchlower names inputs flat
(``xs_0, xs_1``) and also takes a flat dict or tuple, one entry per input; every spelling
becomes ``{input name: {axis: symbol}}``, with the ``Dim``s' bounds beside it.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from torchlower.core.dynamic_forms import derived
from torchlower.errors import InvalidArgumentError

Bounds = tuple[int, "int | None"]


def _signature(module: Any) -> tuple[int, str | None]:
    """``forward``'s count of positional parameters and the name of its ``*args`` (or None)."""
    try:
        params = list(inspect.signature(module.forward).parameters.values()) if module is not None else []
    except (TypeError, ValueError):
        params = []
    fixed = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)
    star = next((p.name for p in params if p.kind is p.VAR_POSITIONAL), None)
    return fixed, star


def per_parameter(module: Any, flat: list[Any]) -> tuple[Any, ...]:
    """Flat per-input entries grouped as ``forward``'s parameters: ``(a, (b, c))`` for
    ``forward(self, a, *rest)``, as ``torch.export`` binds ``dynamic_shapes``; no group when
    no tensor goes to ``*rest`` (torch.export then sees no ``*args`` entry: ultralytics'
    ``forward(self, x, *args, **kwargs)`` called with ``x`` alone)."""
    fixed, star = _signature(module)
    if star is None or len(flat) <= fixed:
        return tuple(flat)
    return (*flat[:fixed], tuple(flat[fixed:]))


def bounds_from_dynamic_shapes(shapes: Any) -> dict[str, Bounds]:
    """``{symbol: (min, max)}`` of the named ``torch.export.Dim``s in ``dynamic_shapes``."""
    out: dict[str, Bounds] = {}
    for dim in torch.utils._pytree.tree_leaves(shapes):
        dim = getattr(dim, "root", dim) if derived(dim) is not None else dim  # 32*Dim("h"): h's bounds
        name = getattr(dim, "__name__", None)
        if isinstance(name, str) and name.isidentifier() and hasattr(dim, "min"):
            lo = max(1, int(getattr(dim, "min", 1) or 1))
            hi = getattr(dim, "max", None)
            out[name] = (lo, int(hi) if isinstance(hi, int) and hi < 2**31 else None)
    return out


def _is_group(entry: Any) -> bool:
    """A ``*args`` entry: a tuple of per-tensor specs (dicts, tuples, None), not a tuple of Dims."""
    parts = (Mapping, list, tuple)
    return (
        isinstance(entry, (list, tuple))
        and any(isinstance(e, parts) for e in entry)
        and all(e is None or isinstance(e, parts) for e in entry)
    )


def _per_input(shapes: Any, names: Sequence[str], module: Any) -> list[tuple[str, Any]]:
    """(input name, that input's spec) for every spelling the module docstring lists."""
    fixed, star = _signature(module)
    rest = list(names[fixed:]) if star is not None and len(names) >= fixed else []
    if isinstance(shapes, Mapping):
        items: list[tuple[str, Any]] = []
        for key, value in shapes.items():
            if star is not None and key == star and (key not in names or _is_group(value)):
                if not isinstance(value, (list, tuple)) or len(value) != len(rest):
                    raise InvalidArgumentError(
                        f"dynamic_shapes[{star!r}] must be a tuple with one entry per tensor passed as"
                        f" *{star} ({len(rest)}), got {value!r}"
                    )
                items += list(zip(rest, value, strict=True))
            elif key in names:
                items.append((key, value))
            else:
                known = list(names) + ([star] if star is not None else [])
                raise InvalidArgumentError(
                    f"dynamic_shapes names unknown inputs [{key!r}]; inputs are {known}"
                )
        return items
    if isinstance(shapes, (list, tuple)):
        if star is not None and len(shapes) == fixed + 1 and _is_group(shapes[fixed]):
            shapes = [*shapes[:fixed], *shapes[fixed]]  # torch.export's nested form of *args
        if len(shapes) != len(names):
            raise InvalidArgumentError(f"dynamic_shapes has {len(shapes)} entries for {len(names)} inputs")
        return list(zip(names, shapes, strict=True))
    raise InvalidArgumentError(f"dynamic_shapes must be a dict or a tuple, got {type(shapes).__name__}")


def axes_from_dynamic_shapes(
    shapes: Any, names: Sequence[str], example: Sequence[torch.Tensor], module: Any = None
) -> dict[str, dict[int, str]]:
    """``torch.export``'s ``dynamic_shapes`` (any spelling above, values ``{axis: Dim}`` or a
    tuple of Dims by axis) as ``dynamic_axes``; a Dim's name becomes the symbol, a derived Dim
    (``32*Dim("h")``) its form (``"32*h"``)."""
    if len(names) != len(example):
        raise InvalidArgumentError(f"{len(names)} input names for {len(example)} inputs")
    out: dict[str, dict[int, str]] = {}
    for name, by_axis in _per_input(shapes, names, module):
        if by_axis is None:
            continue
        if isinstance(by_axis, (list, tuple)):
            by_axis = {a: d for a, d in enumerate(by_axis) if d is not None}
        if not isinstance(by_axis, Mapping):
            raise InvalidArgumentError(f"dynamic_shapes[{name!r}] must be {{axis: Dim}}, got {by_axis!r}")
        out[name] = {}
        for axis, dim in by_axis.items():
            form = derived(dim)  # torch.export's 32*Dim("h") + 1: the axis takes only such sizes
            symbol = form.text() if form is not None else getattr(dim, "__name__", None)
            if form is None and (not isinstance(symbol, str) or not symbol.isidentifier()):
                symbol = f"{name}_{axis}"  # Dim.AUTO / Dim.DYNAMIC carry no name
            out[name][axis] = symbol
    return out

"""Checking the arguments of ``export`` before any work, each error saying how to fix the call.

Kept apart from ``api.py`` so front ends can grow there while the rules for bad calls live
here; ``export`` calls ``export_arguments`` first. Also guards the user's files: an existing
directory is replaced only when it is itself an NNEF artifact.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from torchlower.core.dynamic_forms import SPELLING, parse_form
from torchlower.errors import InvalidArgumentError

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
SUFFIXES = (".nnef.tgz", ".tgz", ".tar.gz", ".nnef.tar", ".tar", ".nnef")
_ARTIFACT_FILES = ("graph.nnef", "graph.quant")


def export_arguments(
    model: Any,
    args: Any,
    path: Any,
    *,
    input_names: Any = None,
    output_names: Any = None,
    frontend: Any = "jit",
    frontends: Sequence[str] = ("jit",),
    check: Any = True,
    tolerance: Any = None,
) -> None:
    """Raise ``InvalidArgumentError`` for the first bad argument of an ``export`` call."""
    model_argument(model)
    args_argument(args)
    path_argument(path)
    names_argument(input_names, "input_names")
    names_argument(output_names, "output_names")
    if not isinstance(frontend, str) or frontend not in frontends:
        raise InvalidArgumentError(f"frontend must be one of {tuple(frontends)}, got {frontend!r}")
    if not isinstance(check, bool) and check != "special":
        raise InvalidArgumentError(f"check must be True, False or 'special', got {check!r}")
    tolerance_argument(tolerance)
    if tolerance is not None and not check:
        raise InvalidArgumentError(
            "tolerance is only used by the check, and check=False turns it off: drop one of them"
        )


def value_dependent_argument(allow: Any, frontend: str) -> None:
    """``allow_value_dependent_trace`` is a bool, and only the jit front end (or auto) reads it."""
    if not isinstance(allow, bool):
        raise InvalidArgumentError(f"allow_value_dependent_trace must be True or False, got {allow!r}")
    if allow and frontend in ("fx", "export"):
        raise InvalidArgumentError(
            f"allow_value_dependent_trace applies to torch.jit.trace; the {frontend} front end never"
            " freezes tensor values (it refuses them): use frontend='jit' or 'auto', or drop the option"
        )


def model_argument(model: Any) -> None:
    from torch import nn

    if isinstance(model, type) and issubclass(model, nn.Module):
        raise InvalidArgumentError(
            f"model is the class {model.__name__}, not an instance: pass {model.__name__}(...) instead"
        )
    if not isinstance(model, nn.Module):
        hint = " (wrap the function in an nn.Module whose forward calls it)" if callable(model) else ""
        raise InvalidArgumentError(f"model must be a torch.nn.Module, got {type(model).__name__}{hint}")


def args_argument(args: Any) -> None:
    import torch

    if isinstance(args, torch.Tensor):
        return
    if isinstance(args, Mapping):
        raise InvalidArgumentError(
            "args must be a tensor or a tuple of tensors in forward()'s order; keyword inputs (a dict)"
            " are not supported: pass tuple(d.values()) in parameter order"
        )
    if type(args).__module__ == "numpy":
        raise InvalidArgumentError("args must be torch tensors, got a numpy array: use torch.from_numpy(a)")
    items = list(args) if isinstance(args, (tuple, list)) else None
    if not items:
        raise InvalidArgumentError(
            f"args must be a tensor or a non-empty tuple of tensors, got {type(args).__name__}"
            + (" (empty)" if items == [] else "")
        )
    for i, a in enumerate(items):
        if not isinstance(a, torch.Tensor):
            hint = ": use torch.from_numpy(a)" if type(a).__module__ == "numpy" else ""
            raise InvalidArgumentError(f"args[{i}] must be a tensor, got {type(a).__name__}{hint}")


def path_argument(path: Any) -> Path:
    """The target path, refusing names without a known suffix and anything that is not ours."""
    if not isinstance(path, (str, os.PathLike)):
        raise InvalidArgumentError(f"path must be a str or os.PathLike, got {type(path).__name__}")
    target = Path(path)
    is_dir_kind = target.name.endswith(".nnef") or (target.is_dir() and not target.name.endswith(SUFFIXES))
    if not target.name.endswith(SUFFIXES) and not target.is_dir():
        raise InvalidArgumentError(
            f"cannot tell the artifact format of {str(path)!r}: use a name ending in .nnef.tgz, "
            ".nnef.tar or .nnef (a directory)"
        )
    if target.is_symlink():
        raise InvalidArgumentError(f"{str(path)!r} is a symbolic link; export to its target's path instead")
    if target.is_dir():
        if not is_dir_kind:
            raise InvalidArgumentError(
                f"{str(path)!r} is a directory but its name asks for an archive;"
                " remove it or choose another name"
            )
        if not looks_like_artifact(target):
            raise InvalidArgumentError(
                f"refusing to replace the directory {str(path)!r}: it is not an NNEF artifact (it holds"
                " other files); choose a new name ending in .nnef"
            )
    elif target.exists() and (is_dir_kind or not target.is_file()):
        raise InvalidArgumentError(
            f"{str(path)!r} exists and is not a directory artifact; remove it or choose another name"
        )
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise InvalidArgumentError(f"output folder {str(folder)!r} does not exist: create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InvalidArgumentError(f"output folder {str(folder)!r} is not writable: choose another path")
    return target


def looks_like_artifact(folder: Path) -> bool:
    """True when ``folder`` holds a graph.nnef and only NNEF files (safe to replace)."""
    if not (folder / "graph.nnef").is_file():
        return False
    for root, dirs, files in os.walk(folder):
        if any(Path(root, d).is_symlink() for d in dirs):
            return False
        for f in files:
            if not (f.endswith(".dat") or (root == str(folder) and f in _ARTIFACT_FILES)):
                return False
    return True


def names_argument(names: Any, what: str) -> None:
    if names is None:
        return
    if isinstance(names, str):
        raise InvalidArgumentError(
            f"{what} must be a list of names, got the string {names!r}: use [{names!r}]"
        )
    if not isinstance(names, (list, tuple)):
        raise InvalidArgumentError(f"{what} must be a list of names, got {type(names).__name__}")
    for n in names:
        if not isinstance(n, str) or not _IDENT.match(n):
            raise InvalidArgumentError(
                f"{what}: {n!r} is not a valid name (letters, digits and '_', not starting with a digit)"
            )
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise InvalidArgumentError(f"{what}: {dupes} given more than once; names must be unique")


def tolerance_argument(tolerance: Any) -> None:
    if tolerance is None:
        return
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)):
        raise InvalidArgumentError(f"tolerance must be a number or None, got {type(tolerance).__name__}")
    if not math.isfinite(tolerance) or tolerance < 0:
        raise InvalidArgumentError(f"tolerance must be a finite number >= 0, got {tolerance!r}")


def dynamic_axes(dynamic: Any, input_names: Sequence[str], ranks: Sequence[int]) -> dict[str, dict[int, str]]:
    """Check ``{input: {axis: symbol}}``; negative axes are normalized. For front ends to call.

    A symbol may be a size form, ``"32*h"`` or ``"32*h + 1"`` (the axis takes only such sizes;
    ``h`` is the symbol): it comes back normalized (``"32*h + 1"``)."""
    if dynamic is None:
        return {}
    if not isinstance(dynamic, Mapping):
        raise InvalidArgumentError(f"dynamic axes must be a dict like {{'x': {{0: 'B'}}}}, got {dynamic!r}")
    out: dict[str, dict[int, str]] = {}
    for name, axes in dynamic.items():
        if name not in input_names:
            raise InvalidArgumentError(
                f"dynamic axes name an unknown input {name!r}; inputs are {list(input_names)}"
            )
        rank = ranks[list(input_names).index(name)]
        if not isinstance(axes, Mapping):
            raise InvalidArgumentError(
                f"dynamic axes of {name!r} must be a dict {{axis: symbol}}, got {axes!r}"
            )
        out[name] = {}
        for axis, symbol in axes.items():
            if isinstance(axis, bool) or not isinstance(axis, int) or not -rank <= axis < rank:
                raise InvalidArgumentError(f"input {name!r} has rank {rank}; axis {axis!r} does not exist")
            symbol = _symbol_name(symbol)
            form = parse_form(symbol)
            if form is None:
                raise InvalidArgumentError(
                    f"dynamic axis symbol {symbol!r} of input {name!r} axis {axis} must be {SPELLING},"
                    " or a tuple ('S', min, max) with integer bounds (max may be None)"
                )
            out[name][axis % rank] = form.text()
    return out


def _symbol_name(symbol: Any) -> Any:
    return symbol[0] if isinstance(symbol, tuple) and len(symbol) == 3 else symbol


def dynamic_bounds(dynamic: Any) -> dict[str, tuple[int, int | None]]:
    """``{symbol: (min, max)}`` from ``dynamic_axes`` entries spelled ``("S", 2, 128)``
    (``("32*h", 1, 8)`` bounds ``h``).

    Call after ``dynamic_axes`` validated the mapping; a symbol given bounds twice must be
    given the same ones.
    """
    out: dict[str, tuple[int, int | None]] = {}
    for axes in (dynamic or {}).values():
        for symbol in axes.values():
            if not isinstance(symbol, tuple):
                continue
            name, lo, hi = symbol
            ok_lo = isinstance(lo, int) and not isinstance(lo, bool) and lo >= 1
            ok_hi = hi is None or (isinstance(hi, int) and not isinstance(hi, bool) and hi >= lo)
            if not (ok_lo and ok_hi):
                raise InvalidArgumentError(
                    f"dynamic axis bounds {symbol!r}: min must be an int >= 1 and max None or an int >= min"
                )
            form = parse_form(name)
            name = form.symbol if form is not None else name  # bounds of "32*h" are h's
            if out.setdefault(name, (lo, hi)) != (lo, hi):
                raise InvalidArgumentError(f"dynamic symbol {name!r} is given two different bounds")
    return out

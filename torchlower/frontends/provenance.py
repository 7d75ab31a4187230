"""Where a model turns a tensor *value* into a Python value (``if x.sum() > 0``, ``.item()``).

``torch.jit.trace`` records one run: a Python value taken from a tensor becomes a constant of
the trace, so a branch, a loop count or a scale computed from the input is frozen at the
example's value and the artifact is wrong on other inputs. The tracer warns ("Converting a
tensor to a Python boolean …"), but it warns for sizes too (``int(x.shape[1])`` under tracing
is a tensor), which stay correct. To tell the two apart, ``value_conversions`` runs the model
once eagerly under a ``TorchFunctionMode`` that marks every tensor computed from the inputs'
values; a conversion of a marked tensor is value-dependent. Sizes are plain ints in eager mode,
and tensors computed from parameters alone are constants, so neither is reported.
"""

from __future__ import annotations

import contextlib
import linecache
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils.weak import WeakIdKeyDictionary

_TORCH_DIR = str(Path(torch.__file__).parent)
_OWN_DIR = str(Path(__file__).resolve().parents[1])

# Python values taken from a tensor's data
_CONVERSIONS = {
    "__bool__": "bool(tensor)",
    "__int__": "int(tensor)",
    "__float__": "float(tensor)",
    "__index__": "a tensor used as an index",
    "__complex__": "complex(tensor)",
    "item": ".item()",
    "tolist": ".tolist()",
    "numpy": ".numpy()",
    "equal": "torch.equal",
    "allclose": "torch.allclose",
}
# results that depend on a tensor's shape, dtype or device only, never on its values
_SHAPE_ONLY = {
    "size", "dim", "numel", "nelement", "ndimension", "__len__", "__get__", "stride",
    "new_zeros", "new_ones", "new_empty", "new_full", "new_tensor",
    "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like", "randint_like",
    "element_size", "is_floating_point", "is_complex", "get_device", "is_contiguous",
}  # fmt: skip


@dataclass(frozen=True)
class Conversion:
    """One place where a value computed from the inputs became a Python value."""

    what: str  # "bool(tensor)", ".item()" …
    file: str
    line: int
    code: str

    def __str__(self) -> str:
        code = f": `{self.code}`" if self.code else ""
        return f"{Path(self.file).name}:{self.line} ({self.what}){code}"


class _Taint(TorchFunctionMode):
    """Marks tensors computed from the inputs' values; records conversions of marked tensors."""

    def __init__(self, inputs: Sequence[torch.Tensor]) -> None:
        super().__init__()
        self.marked: WeakIdKeyDictionary = WeakIdKeyDictionary()
        for t in inputs:
            self.marked[t] = True
        self.found: list[Conversion] = []

    def _is_marked(self, tree: Any) -> bool:
        return any(isinstance(t, torch.Tensor) and t in self.marked for t in pytree.tree_leaves(tree))

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        marked = name not in _SHAPE_ONLY and self._is_marked((args, kwargs))
        if marked and name in _CONVERSIONS:
            self.found.append(_user_frame(_CONVERSIONS[name]))
        out = func(*args, **kwargs)
        if marked:
            for t in pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.marked[t] = True
            if (name.endswith("_") or name == "__setitem__") and args and isinstance(args[0], torch.Tensor):
                self.marked[args[0]] = True  # written in place: buf[i] = x, buf.add_(x)
        return out


def is_library(path: str) -> bool:
    """A frame of torch's or torchlower's own code, not the model's."""
    return path.startswith((_TORCH_DIR, _OWN_DIR))


def model_frame(frames: Sequence[tuple[str, Any, Any]]) -> tuple[str, Any, Any] | None:
    """The model's own frame of a stack given innermost first (``(path, line, function)``).

    torch's frames are skipped, and so are torchlower's innermost ones (a tracer's own hooks);
    past those, a torchlower frame ends the search: the frames beyond it are the caller of
    ``torchlower.export`` (a script, a test harness), never where an op is used. None when no
    frame inside the model call is the user's (a torch module's own ``forward``).
    """
    inside = False
    for frame in frames:
        path = frame[0]
        if path.startswith(_OWN_DIR):
            if inside:
                return None
            continue
        inside = True
        if not path.startswith(_TORCH_DIR) and path[:1] != "<":
            return frame
    return None


def _user_frame(what: str) -> Conversion:
    """The innermost frame outside torch and torchlower: the model's own source line."""
    for frame in reversed(traceback.extract_stack()):
        if not is_library(frame.filename) and frame.filename[:1] != "<":
            code = (frame.line or linecache.getline(frame.filename, frame.lineno or 0)).strip()
            return Conversion(what, frame.filename, frame.lineno or 0, code)
    return Conversion(what, "<unknown>", 0, "")


def raised_at(exc: BaseException) -> str | None:
    """``model.py:12: `x.reshape(2, 8)``` — the model's own line an exception came from."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if not is_library(frame.filename) and frame.filename[:1] != "<":
            code = (frame.line or "").strip()
            return f"{Path(frame.filename).name}:{frame.lineno}" + (f": `{code}`" if code else "")
    cause = exc.__cause__ or exc.__context__
    return raised_at(cause) if cause is not None and cause is not exc else None


@contextlib.contextmanager
def _as_if_tracing() -> Iterator[None]:
    """``torch.jit.is_tracing()`` answers True during the eager witness run.

    Why: the witness must take the path the trace took. Libraries branch on it to avoid reading
    values under tracing — transformers' mask code skips an all-ones mask with
    ``padding_mask.all()`` only when *not* tracing — so an eager run that answered False would
    report a conversion the trace never made (and refuse every HF model under jit).
    """
    real = torch.jit.is_tracing
    torch.jit.is_tracing = lambda: True  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.jit.is_tracing = real  # type: ignore[assignment]


def value_conversions(
    module: nn.Module, args: Sequence[Any], fn_name: str = "forward"
) -> list[Conversion] | None:
    """Each distinct place where ``module`` converts an input-dependent tensor to Python;
    None when the eager run fails (the caller then trusts the tracer's warnings alone)."""
    inputs = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]  # never the user's
    mode = _Taint([a for a in inputs if isinstance(a, torch.Tensor)])
    try:
        with torch.no_grad(), _as_if_tracing(), mode:
            getattr(module, fn_name)(*inputs)
    except Exception:  # the trace ran, so this is rare (a mode-hostile extension op)
        return None
    seen: dict[tuple[str, int], Conversion] = {}
    for c in mode.found:
        seen.setdefault((c.file, c.line), c)
    return list(seen.values())


REWRITES = (
    "Rewrite it without taking a Python value from a tensor: a branch as"
    " torch.where(cond, a, b) (a torch.cond-style select that computes both sides), a scale as a"
    " tensor op (x / x.abs().max(), no float() or .item()), a data-dependent loop with a fixed"
    " trip count and a torch.where mask."
)


def message(model: str, conversions: Sequence[Conversion], opt_in: str) -> str:
    """The TraceError text: which lines, why the trace is wrong, how to fix or opt in."""
    where = "; ".join(str(c) for c in conversions)
    return (
        f"torch.jit.trace of {model} depends on tensor values: the model turns a tensor computed"
        f" from its inputs into a Python value at {where}. The trace keeps the example's value as a"
        f" constant, so the artifact would be wrong for other inputs. {REWRITES} If the value"
        f" never changes for your inputs, pass {opt_in} (the check then verifies it on random"
        " inputs too)."
    )

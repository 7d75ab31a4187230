"""Dynamic axes: symbolic sizes for the dims a user declares variable.

Front ends whose graphs carry concrete sizes (jit traces, FX shape propagation) capture the
model at several size assignments — the example, each symbol moved alone twice, all symbols
moved together — and ``core/size_fit.py`` turns the sizes observed at those points into
integer expressions over the symbols (``B``, ``B*S``, ``S + 1``, ``(S - 1)//2 + 1``…) that hold
at every size. A size that no such expression explains, or a graph whose structure changes with
the sizes, is a dimension that cannot be dynamic: the error names the input, the axis and the op.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from torchlower.core import dynamic_probe
from torchlower.core.dynamic_forms import Form, parse_form
from torchlower.core.dynamic_shapes import (
    Bounds,
    axes_from_dynamic_shapes,
    bounds_from_dynamic_shapes,
    per_parameter,
)
from torchlower.core.dynamic_sizes import scalar_op
from torchlower.core.values import Shape, SymDim, Value
from torchlower.errors import DynamicAxisError, InvalidArgumentError

__all__ = [  # the spellings and size arithmetic live in their own modules; importable from here too
    "UNFIT", "Bounds", "Spec", "axes_from_dynamic_shapes", "bounds_from_dynamic_shapes", "materialize",
    "not_dynamic", "resize", "scalar_op",
]  # fmt: skip

UNFIT = object()  # a fitted constant's "no expression" (None is a legitimate constant)
_MOVES = (1, 3)  # each symbol alone at base + 1 and base + 3; the joint point at base + 2
_JOINT = 2
_FAR = 7


@dataclass
class Spec:
    """Which input axes are symbolic, and the sizes of each symbol in every capture."""

    axes: dict[int, dict[int, str]]  # input index -> axis -> symbol
    names: list[str]  # input names, for messages
    base: dict[str, int]
    points: list[dict[str, int]] = field(default_factory=list)
    far: int | None = None  # index of the far point: dropped when the model cannot run there
    bounds: dict[str, Bounds] = field(default_factory=dict)  # symbol -> (min, max or None)
    skipped: list[tuple[dict[str, int], str]] = field(default_factory=list)  # check sizes PyTorch refuses
    extra_checks: list[dict[str, int]] = field(default_factory=list)  # sizes a front end wants checked
    forms: dict[int, dict[int, Form]] = field(default_factory=dict)  # input -> axis -> k*symbol + c
    notes: list[str] = field(default_factory=list)  # what the probe adopted, for the report
    export_restricts: bool = True  # torch.export's own bounds (sizes PyTorch runs at) may be adopted

    def drop_far(self) -> None:
        """Forget the far point (e.g. a sequence longer than the model's context)."""
        if self.far is not None:
            del self.points[self.far]
            self.far = None

    @staticmethod
    def build(
        dynamic: Mapping[str, Mapping[int, str]],
        names: Sequence[str],
        example: Sequence[torch.Tensor],
        bounds: Mapping[str, Bounds] | None = None,
    ) -> Spec | None:
        """A spec from validated ``{input: {axis: symbol}}``; None when nothing is dynamic.
        A symbol may be a multiple, ``"32*h"`` (``dynamic_forms``): ``h`` is then the symbol.

        ``bounds``: ``{symbol: (min, max)}`` (max None: unbounded); every size the capture and
        the check use stays inside them.
        """
        axes: dict[int, dict[int, str]] = {}
        forms: dict[int, dict[int, Form]] = {}
        base: dict[str, int] = {}
        for name, by_axis in dynamic.items():
            i = list(names).index(name)
            for axis, text in by_axis.items():
                form = parse_form(text)
                if form is None:
                    raise InvalidArgumentError(f"dynamic axis {name!r} {axis}: {text!r} is not a size form")
                size = int(example[i].shape[axis])
                value = form.value(size)
                if value is None:
                    raise InvalidArgumentError(
                        f"input {name!r} axis {axis} is {size} in the example inputs, not {form.text()}:"
                        f" {size} is not {form.rule()}"
                    )
                symbol = form.symbol
                if base.setdefault(symbol, value) != value:
                    raise InvalidArgumentError(
                        f"dynamic symbol {symbol!r} has size {base[symbol]} on one axis and {value} on"
                        f" {name!r} axis {axis} in the example inputs; one symbol must have one size"
                    )
                axes.setdefault(i, {})[axis] = symbol
                forms.setdefault(i, {})[axis] = form
        if not axes:
            return None
        limits = {s: (bounds or {}).get(s, (1, None)) for s in base}
        for s, (lo, hi) in limits.items():
            if base[s] < lo or (hi is not None and base[s] > hi):
                raise InvalidArgumentError(
                    f"dynamic symbol {s!r} is {base[s]} in the example inputs, outside its bounds"
                    f" {lo}..{hi if hi is not None else 'inf'}"
                )
        spec = Spec(axes, list(names), base, bounds=limits, forms=forms)
        spec.sample()
        return spec

    def sample(self) -> None:
        """The capture points: the example, each symbol moved alone twice, all moved together,
        the check's own sizes and one far point."""
        base = self.base
        self.points, self.far = [dict(base)], None
        for s in base:
            first = self._move(s, _MOVES[0], ())
            self.points += [{**base, s: first}, {**base, s: self._move(s, _MOVES[1], (first,))}]
        if len(base) > 1:
            self.points.append({s: self._clamp(s, v + _JOINT) for s, v in base.items()})
        # the check's own sizes too (a branch on the size between them is seen while capturing),
        # and one far point, so that a floor expression fitted to a branch's few sizes fails
        far = self.far_point
        self.points += [p for p in self.check_points() if p not in self.points]
        if far not in self.points:
            self.points.append(far)
            self.far = len(self.points) - 1

    def _clamp(self, s: str, v: int) -> int:
        lo, hi = self.bounds.get(s, (1, None))
        return max(lo, v if hi is None else min(hi, v))

    def _move(self, s: str, m: int, taken: Sequence[int]) -> int:
        """``base + m``, else the nearest other size inside the bounds (the capture needs two)."""
        v = self.base[s]
        lo, hi = self.bounds.get(s, (1, None))
        top = hi if hi is not None else v + m + 8
        for cand in (v + m, v - m, *sorted(range(lo, top + 1), key=lambda c: (abs(c - v), c))):
            if cand != v and cand not in taken and cand >= lo and (hi is None or cand <= hi):
                return cand
        raise InvalidArgumentError(
            f"the bounds {lo}..{hi} of dynamic symbol {s!r} leave no other size to capture the model at;"
            " widen them or make the axis static"
        )

    def check_points(self) -> list[dict[str, int]]:
        """Sizes the export's own check runs at besides the example: smaller and larger, inside the
        bounds, minus those where PyTorch itself fails (``probe``)."""
        # halving a size of 1 (a batch-1 example) gives 1 again: such a symbol moves up to 2 instead,
        # so a batch-1 export is still checked at two other sizes
        small = {s: self._clamp(s, max(1, v // 2) if v > 1 else v + 1) for s, v in self.base.items()}
        large = {s: self._clamp(s, v + 4) for s, v in self.base.items()}
        # a symbol whose axes are multiples (``32*h``) is checked at the next multiple too
        steps = [{**self.base, s: self._clamp(s, v + 1)} for s, v in self.base.items() if self.stepped(s)]
        refused = [p for p, _ in self.skipped]
        out: list[dict[str, int]] = []
        for p in (small, large, *steps, *self.extra_checks):
            if p != self.base and p not in out and p not in refused:
                out.append(p)
        return out

    def probe(self, run: Any, example: Sequence[torch.Tensor]) -> None:
        """Adopt the multiples the model needs, then drop the check sizes PyTorch refuses
        (``dynamic_probe.probe``)."""
        dynamic_probe.probe(self, run, example)

    @property
    def far_point(self) -> dict[str, int]:
        """The capture's far point (``2 * size + 7``, inside the bounds)."""
        return {s: self._clamp(s, 2 * v + _FAR) for s, v in self.base.items()}

    def stepped(self, s: str) -> bool:
        """Some axis of ``s`` is a multiple (``32*h``) rather than the symbol itself."""
        return any(not f.plain for by_axis in self.forms.values() for f in by_axis.values() if f.symbol == s)

    def capture_point(self) -> dict[str, int]:
        """The example's sizes with symbols at 0 or 1 moved to the next size inside their bounds:
        torch.export specializes sizes 0 and 1 of its example (a batch-1 example pins B)."""
        out = dict(self.base)
        for s, v in self.base.items():
            lo, hi = self.bounds.get(s, (1, None))
            if v <= 1 and (hi is None or hi >= 2):
                out[s] = max(2, lo)
        return out

    def form(self, i: int, axis: int, symbol: str | None = None) -> Form:
        """The size form of input ``i``'s dynamic ``axis`` (a plain symbol unless declared)."""
        return self.forms.get(i, {}).get(axis) or Form(symbol or self.axes[i][axis])

    def assertions(self) -> list[str]:
        """tract assertions of the bounds (``S >= 2``, ``S <= 128``), for the graph's extensions."""
        out = []
        for s, (lo, hi) in self.bounds.items():
            if lo > 1:
                out.append(f"{s} >= {lo}")
            if hi is not None:
                out.append(f"{s} <= {hi}")
        return out

    def export_dims(self, example: Sequence[torch.Tensor], module: Any = None) -> Any:
        """``dynamic_shapes`` for ``torch.export``, one ``Dim`` per symbol with its bounds, in
        the structure of ``module.forward``'s signature (``*args`` is one nested tuple)."""
        dims = {s: torch.export.Dim(s, min=lo, max=hi) if hi is not None else torch.export.Dim(s, min=lo)
                for s, (lo, hi) in self.bounds.items()}  # fmt: skip

        def dim(i: int, axis: int, s: str) -> Any:
            form = self.form(i, axis, s)
            return dims[s] if form.plain else form.k * dims[s] + form.c  # a derived Dim

        flat = [
            {a: dim(i, a, s) for a, s in self.axes[i].items()} if i in self.axes else None
            for i in range(len(example))
        ]
        return per_parameter(module, flat)

    # ---- inputs ---------------------------------------------------------------------------
    def input_shape(self, index: int, tensor: torch.Tensor) -> Shape:
        by_axis = self.axes.get(index, {})
        return tuple(
            self.form(index, a).dim() if a in by_axis else int(d) for a, d in enumerate(tensor.shape)
        )

    def example_at(
        self, example: Sequence[torch.Tensor], point: Mapping[str, int]
    ) -> tuple[torch.Tensor, ...]:
        """The example inputs resized to ``point``, repeating their own values (ids stay valid)."""
        out = []
        for i, t in enumerate(example):
            for axis, symbol in self.axes.get(i, {}).items():
                t = resize(t, axis, self.form(i, axis, symbol).size(point[symbol]))
            out.append(t)
        return tuple(out)

    def where(self, symbols: Sequence[str]) -> str:
        """``input 'x' axis 1 (S)`` for the first axis of each symbol, for messages."""
        parts = []
        for s in symbols:
            for i, by_axis in sorted(self.axes.items()):
                axis = next((a for a, sym in by_axis.items() if sym == s), None)
                if axis is not None:
                    form = self.form(i, axis, s)
                    shown = (
                        s if form.plain else f"{form.label} = {form.text()}" if form.label else form.text()
                    )
                    parts.append(f"input {self.names[i]!r} axis {axis} ({shown})")
                    break
        return ", ".join(parts)

    # ---- fitting ----------------------------------------------------------------------------
    def depends(self, values: Sequence[int]) -> list[str]:
        """Symbols whose own moves change ``values`` (one value per point)."""
        deps = []
        for k, s in enumerate(self.base):
            moved = values[1 + 2 * k : 3 + 2 * k]
            if any(v != values[0] for v in moved):
                deps.append(s)
        return deps

    def changed(self, values: Sequence[Any]) -> list[str]:
        """Symbols whose moves change a value (for messages about values that cannot be fitted)."""
        out = []
        for k, s in enumerate(self.base):
            if any(not same_value(values[1 + 2 * k + j], values[0]) for j in range(2)):
                out.append(s)
        return out or list(self.base)


def same_value(a: Any, b: Any) -> bool:
    """Equal constants (tensors: same shape, dtype and values)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.shape == b.shape
            and a.dtype == b.dtype
            and bool((a == b).all() if a.numel() else True)
        )
    try:
        return bool(a == b)
    except Exception:
        return False


def resize(t: torch.Tensor, axis: int, n: int) -> torch.Tensor:
    """``t`` with ``n`` entries along ``axis``, cycling through its own values."""
    return t.index_select(axis, torch.arange(n) % t.shape[axis])


def materialize(b: Any, d: SymDim) -> Value:
    """A size expression as a rank-0 i64 tensor (tract evaluates TDim literals at run time)."""
    return b.call("tract_core_cast", [d], {"to": "i64"}, dtype=torch.int64, shape=())


def not_dynamic(spec: Spec, symbols: Sequence[str], what: str, advice: bool = True) -> DynamicAxisError:
    """The error for a size that cannot stay symbolic (one paragraph: input, axis, op, line)."""
    tail = (
        ". Make that size static (drop it from dynamic_axes), give it bounds the model accepts"
        " (dynamic_axes {input: {axis: ('S', min, max)}}), or compute it from tensor shapes in the"
        " model instead of in Python"
        if advice
        else ""
    )
    return DynamicAxisError(f"{spec.where(symbols)} cannot be dynamic: {what}{tail}")

"""Guards for special values and tails: NaN, ±inf and very negative inputs as torch has them.

Each rewrite is scoped to float (f32 / f16) operands and names the tract 0.23.9 behaviour it
steers around (measured with the ``tract`` Python package on a one-op graph):

- ``accurate_sigmoid``: tract's ``sigmoid`` has an absolute floor of ~4.5e-7: ``sigmoid(-17)``,
  ``sigmoid(-90)`` and ``sigmoid(-inf)`` are all 4.47e-7 (torch 4.1e-8, 0, 0) and
  ``sigmoid(NaN)`` is 4.47e-7 too; ``tract_core_silu`` inherits it (``silu(-40)`` -6.5e-6, torch
  -1.7e-16; ``silu(NaN)`` and ``silu(-inf)`` -6.5e-6, torch NaN). Both become
  ``exp(min(x, 0)) / (1 + exp(-|x|))`` (times ``x`` for silu): torch's relative accuracy over the
  whole range, 0 / 1 at ∓inf, NaN kept (through ``|x|``). Costs a second ``exp``: ~2× the time
  of the sigmoid alone ([1, 64, 56, 56]: 2.4–4.5 ms → 6.2 ms single-threaded, loaded machine).
- ``nan_extrema`` (before ``wide_extrema``): tract's ``max_reduce`` / ``min_reduce`` skip NaN
  (``max([1, NaN, 3])`` is 3; torch NaN). The row's NaN is brought back with
  ``select(isnan(s), s, reduce(x))``, ``s`` the sum of ``x``'s NaNs (zeros elsewhere). Not in
  ``precision="f16"`` graphs (left as tract computes it there).
- ``nan_tanh``: tract's ``tanh(NaN)`` is -0.9999994 (torch NaN): ``select(isnan(x), x, tanh(x))``.
- ``nan_min_max`` (written, **not applied**): tract's binary ``max`` / ``min`` return the other
  operand for a NaN (``max(NaN, 0.0)`` is 0, so ``clamp`` too). Selecting the NaN back on every
  graph broke rules that rely on that very behaviour (``log1p``'s ``min(x / gap, 2)`` turns
  inf/inf into 2, so ``log1p(inf)`` became NaN): it needs the clamp / maximum / minimum rules
  to mark their own min / max first.

Left as tract computes it (docs/reliability.md): ``relu``, ``clamp``, ``maximum`` / ``minimum``
of NaN, ``argmax`` / ``argmin`` skipping NaN, ``max_pool`` windows (pooling, not reductions).
"""

from __future__ import annotations

import torch

from torchlower.core.values import Value
from torchlower.nnef import graph_edit as edit
from torchlower.nnef import text
from torchlower.nnef.builder import NNEFBuilder
from torchlower.nnef.guards_matmul import replacing

Assignment = text.Assignment
_FLOATS = (torch.float32, torch.float16)
_EXTREMA = ("max_reduce", "min_reduce")
_COMPARISONS = {"gt", "ge", "lt", "le", "eq", "ne"}


def apply_before_passes(b: NNEFBuilder) -> None:
    """Every guard of this module (before ``wide_extrema``, which widens the reduction kept)."""
    nan_extrema(b)
    accurate_sigmoid(b)
    nan_tanh(b)


def _float(v: object) -> bool:
    return isinstance(v, Value) and v.dtype in _FLOATS


def _fresh(b: NNEFBuilder, like: Value, tag: str, dtype: torch.dtype | None = None, shape=None) -> Value:  # type: ignore[no-untyped-def]
    return Value(b.fresh(f"{like.name}_{tag}"), dtype or like.dtype, like.shape if shape is None else shape)


def accurate_sigmoid(b: NNEFBuilder) -> bool:
    """Float ``sigmoid`` / ``tract_core_silu`` in the form exact in the negative tail."""

    def replace(a: Assignment) -> list[Assignment] | None:
        if a.op not in ("sigmoid", "tract_core_silu") or len(a.args) != 1 or not _float(a.args[0]):
            return None
        x, y = a.args[0], a.outputs[0]
        if y.dtype != x.dtype:
            return None
        m, e, n, f, d = (_fresh(b, x, t) for t in ("neg_part", "exp_neg", "abs", "exp_abs", "denominator"))
        s = y if a.op == "sigmoid" else _fresh(b, x, "sigmoid")
        steps = [
            Assignment([m], "min", [x, 0.0], {}, a.scope),
            Assignment([e], "exp", [m], {}, a.scope),
            Assignment([n], "abs", [x], {}, a.scope),
            Assignment([n2 := _fresh(b, x, "minus_abs")], "neg", [n], {}, a.scope),
            Assignment([f], "exp", [n2], {}, a.scope),
            Assignment([d], "add", [f, 1.0], {}, a.scope),
            Assignment([s], "div", [e, d], {}, a.scope),
        ]
        if a.op == "tract_core_silu":
            steps.append(Assignment([y], "mul", [x, s], {}, a.scope))
        return steps

    return replacing(b, replace)


def _isnan(b: NNEFBuilder, x: Value, scope: str) -> tuple[Value, Assignment]:
    n = _fresh(b, x, "isnan", torch.bool)
    return n, Assignment([n], "tract_core_is_nan", [x], {}, scope)


def nan_extrema(b: NNEFBuilder) -> bool:
    """Float ``max_reduce`` / ``min_reduce``: a row holding NaN gives NaN. Not where only
    comparisons read the result (attention's test for fully masked rows, which
    ``nnef/fusions.py`` recognizes and drops: the softmax there carries the NaN anyway)."""
    if b.precision == "f16":  # values are typed f32 until the f16 pass: no typed constant fits
        return False
    readers: dict[str, set[str]] = {}
    for a in b.assignments:
        for v in a.args:
            if isinstance(v, Value):
                readers.setdefault(v.name, set()).add(a.op)

    def replace(a: Assignment) -> list[Assignment] | None:
        if a.op not in _EXTREMA or len(a.args) != 1 or len(a.outputs) != 1 or not _float(a.args[0]):
            return None
        if readers.get(a.outputs[0].name, {"output"}) <= _COMPARISONS:
            return None
        x, y = a.args[0], a.outputs[0]
        if y.dtype != x.dtype:
            return None
        n, isnan = _isnan(b, x, a.scope)
        rank = len(x.shape) if x.shape is not None else 0
        zero, define = edit.variable(b, torch.zeros([1] * rank, dtype=x.dtype), f"constants/{y.name}_zero")
        only, s, r, bad = (_fresh(b, x, "nan_only"), _fresh(b, y, "nans"), _fresh(b, y, "kept"),
                           _fresh(b, y, "has_nan", torch.bool))  # fmt: skip
        return [
            isnan,
            define,  # a typed zero: tract's select takes no f32 literal beside an f16 tensor
            Assignment([only], "select", [n, x, zero], {}, a.scope),
            Assignment([s], "sum_reduce", [only], dict(a.attrs), a.scope),
            Assignment([r], a.op, [x], dict(a.attrs), a.scope),
            Assignment([bad], "tract_core_is_nan", [s], {}, a.scope),
            Assignment([y], "select", [bad, s, r], {}, a.scope),
        ]

    return replacing(b, replace)


def nan_tanh(b: NNEFBuilder) -> bool:
    """Float ``tanh`` keeps a NaN. Not in the hand-written tanh-GELU ``x · (1 + tanh(…))``
    (Hugging Face's ``gelu_new``): the product with ``x`` carries the NaN already."""
    readers: dict[str, list[Assignment]] = {}
    for a in b.assignments:
        for v in a.args:
            if isinstance(v, Value):
                readers.setdefault(v.name, []).append(a)

    def gelu_form(y: Value) -> bool:
        first = readers.get(y.name, [])
        return bool(first) and all(
            r.op == "add" and any(isinstance(v, float) for v in r.args)
            and all(m.op == "mul" for m in readers.get(r.outputs[0].name, [None]) if m is not None)
            and bool(readers.get(r.outputs[0].name))
            for r in first
        )  # fmt: skip

    def replace(a: Assignment) -> list[Assignment] | None:
        if a.op != "tanh" or len(a.args) != 1 or not _float(a.args[0]):
            return None
        x, y = a.args[0], a.outputs[0]
        if y.dtype != x.dtype or gelu_form(y):
            return None
        n, isnan = _isnan(b, x, a.scope)
        t = _fresh(b, y, "tanh")
        return [
            isnan,
            Assignment([t], "tanh", [x], {}, a.scope),
            Assignment([y], "select", [n, x, t], {}, a.scope),
        ]

    return replacing(b, replace)


def nan_min_max(b: NNEFBuilder) -> bool:
    """Float binary ``max`` / ``min`` give the NaN operand (as torch's ``maximum``, ``clamp``).
    A clamp's chain ``min(max(x, lo), hi)`` (the inner read once, a scalar bound) is guarded
    once, on ``x``."""
    producers, uses = edit.producers(b), edit.uses(b)
    inner: dict[str, Value] = {}  # an outer max / min's operand name -> the chain's input
    for a in b.assignments:
        if a.op in ("max", "min") and len(a.args) == 2 and sum(_float(v) for v in a.args) == 1:
            (v,) = [v for v in a.args if _float(v)]
            p = producers.get(v.name)
            if p is not None and p.op in ("max", "min") and uses[v.name] == 1 and len(p.args) == 2:
                tensors = [u for u in p.args if isinstance(u, Value)]
                if len(tensors) == 1 and _float(tensors[0]):
                    inner[v.name] = tensors[0]
    absorbed = set(inner)

    def replace(a: Assignment) -> list[Assignment] | None:
        if a.op not in ("max", "min") or len(a.args) != 2 or a.outputs[0].dtype not in _FLOATS:
            return None
        y = a.outputs[0]
        if y.name in absorbed or not any(_float(v) for v in a.args):
            return None
        value = _fresh(b, y, a.op)
        steps = [Assignment([value], a.op, list(a.args), dict(a.attrs), a.scope)]
        tensors = [inner.get(v.name, v) for v in a.args if _float(v)]
        for k, v in enumerate(tensors):
            n, isnan = _isnan(b, v, a.scope)
            out = y if k == len(tensors) - 1 else _fresh(b, y, f"{a.op}_nan{k}")
            steps += [isnan, Assignment([out], "select", [n, v, value], {}, a.scope)]
            value = out
        return steps

    return replacing(b, replace)

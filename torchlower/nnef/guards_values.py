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
  ``select(isnan(s), s, reduce(x))``, ``s`` the sum of ``x``'s NaNs (zeros elsewhere); in
  ``precision="f16"`` graphs too (the zero typed f16 there).
- ``nan_tanh``: tract's ``tanh(NaN)`` is -0.9999994 (torch NaN): ``select(isnan(x), x, tanh(x))``.
- ``fused_clamps``: tract's binary ``max`` / ``min`` and ``relu`` return the other operand for a
  NaN (``max(NaN, 0.0)`` is 0). The clamp family is lowered NaN-keeping by its rules
  (``rules/nan.py``: compare and select, which every rule relying on tract's own ``min`` —
  ``log1p``'s ``min(x / gap, 2)`` — does not use); this guard gives tract's fusable form back
  where the clamp reads a conv / matmul output, for speed (the one difference left there).
- ``torch_casts``: tract's float → integer casts saturate (NaN → 0, +inf → MAX) where torch's
  x86 kernels give the "integer indefinite" value: INT_MIN of the 32- or 64-bit conversion
  (and its low bits, 0, for 8- and 16-bit targets).
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
    fused_clamps(b)
    nan_pools(b)
    torch_casts(b)
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
        zero, define = _typed(b, x, 0.0, "zero")  # f16 in an f16 export
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


_KERNELS = ("conv", "deconv", "matmul", "linear", "tract_core_einsum")
_AFFINE = ("add", "sub", "mul", "div")  # bias, batch norm, residual: tract fuses them into the kernel
_CHAIN = 4


def _from_kernel(
    v: object, producers: dict[str, Assignment], uses: dict[str, int], depth: int = _CHAIN
) -> bool:
    """Whether ``v`` is a conv / matmul output, maybe through single-use affine steps."""
    p = producers.get(v.name) if isinstance(v, Value) else None
    if p is None or depth == 0:
        return False
    if p.op in _KERNELS:
        return True
    return p.op in _AFFINE and any(
        _from_kernel(u, producers, uses, depth - 1)
        for u in p.args
        if isinstance(u, Value) and uses[u.name] == 1
    )


def fused_clamps(b: NNEFBuilder) -> bool:
    """Speed over NaN where tract fuses: a NaN-keeping clamp / ReLU (``rules/nan.py``: compare and
    select) of a conv or matmul output becomes tract's ``relu`` / ``max`` / ``min`` again, which
    tract 0.23.9 fuses into the kernel. Measured single-threaded with the selects everywhere:
    ResNet-18 1.20×, MobileNet-v2 2.66× slower (its ReLU6 after every conv). There a NaN coming
    out of the conv becomes the bound and ``-0.0`` becomes +0 (docs/reliability.md; the check's
    special-values point finds it, ``check="special"`` refuses it)."""
    if not b.clamps:
        return False
    producers, uses = edit.producers(b), edit.uses(b)

    def replace(a: Assignment) -> list[Assignment] | None:
        if len(a.outputs) != 1 or a.outputs[0].name not in b.clamps:
            return None
        x, lo, hi, first = b.clamps[a.outputs[0].name]
        # only where tract can fuse it: x read by nothing but this clamp's test and select (an
        # unfused tract relu drops the NaN; fused into the kernel it kept it in every case tried)
        if uses[x.name] != 2 or not _from_kernel(x, producers, uses, _CHAIN + 1):
            return None
        y = a.outputs[0]
        if lo == 0.0 and hi is None:
            return [Assignment([y], "relu", [x], {}, a.scope)]
        if lo is None or hi is None:
            return [
                Assignment([y], "max" if hi is None else "min", [x, lo if hi is None else hi], {}, a.scope)
            ]
        # the lo step keeps its name (the archive as the plain max / min wrote it); its select goes
        renamed.add(first.name)
        return [
            Assignment([first], "max", [x, lo], {}, a.scope),
            Assignment([y], "min", [first, hi], {}, a.scope),
        ]

    renamed: set[str] = set()
    changed = replacing(b, replace)
    if renamed:
        b.assignments = [a for a in b.assignments if not (a.op == "select" and a.outputs[0].name in renamed)]
    if changed:
        b.assignments = b.live_assignments()
    return changed


_NUMBER_ONLY = ("relu",)  # tract's relu / max with a finite scalar: never NaN, never -inf


def _numbers_only(v: Value, producers: dict[str, Assignment]) -> bool:
    p = producers.get(v.name)
    if p is None:
        return False
    if p.op in _NUMBER_ONLY:
        return True
    return p.op == "max" and any(isinstance(u, float) and u == u and u > float("-inf") for u in p.args)


def _typed(b: NNEFBuilder, like: Value, value: float, tag: str) -> tuple[Value, Assignment]:
    """A rank-matched constant of ``like``'s working type (f16 in an f16 export)."""
    dtype = torch.float16 if b.precision == "f16" and like.dtype == torch.float32 else like.dtype
    rank = len(like.shape) if like.shape is not None else 0
    return edit.variable(b, torch.full([1] * rank, value, dtype=dtype), f"constants/{like.name}_{tag}")


def nan_pools(b: NNEFBuilder) -> bool:
    """Float ``max_pool`` with torch's NaN and all-``-inf`` windows. tract 0.23.9 skips NaN in a
    window (``[NaN, inf]`` gives inf, torch NaN) and starts from the type's finite extreme (a
    window of only ``-inf`` gives -3.4e38). A mark (2 for NaN, 1 for a number, 0 for ``-inf``)
    is pooled alongside; its window maximum says which windows to fix. Not where the input is
    tract's ``relu`` / ``max`` with a finite bound (it holds neither: the ReLU before a ResNet's
    stem pool, kept fused by ``fused_clamps``)."""
    producers = edit.producers(b)

    def replace(a: Assignment) -> list[Assignment] | None:
        if a.op != "max_pool" or len(a.args) != 1 or not _float(a.args[0]) or len(a.outputs) != 1:
            return None
        x, y = a.args[0], a.outputs[0]
        if _numbers_only(x, producers) or y.dtype != x.dtype:
            return None
        consts = [_typed(b, x, v, t) for v, t in ((2.0, "two"), (float("-inf"), "ninf"))]
        outs = [_typed(b, y, v, t) for v, t in ((float("nan"), "nan"), (float("-inf"), "ninf"))]
        (two, d2), (ninf, d3) = consts
        (nan, d4), (yninf, d5) = outs
        n, isnan = _isnan(b, x, a.scope)
        num, numf, mark, worst, value, low, fixed, bad = (
            _fresh(b, x, "number", torch.bool), _fresh(b, x, "numberf"), _fresh(b, x, "mark"),
            _fresh(b, y, "worst"), _fresh(b, y, "pooled"), _fresh(b, y, "all_ninf", torch.bool),
            _fresh(b, y, "fixed"), _fresh(b, y, "has_nan", torch.bool))  # fmt: skip
        working = "f16" if b.precision == "f16" and x.dtype == torch.float32 else text_dtype(x.dtype)
        return [
            d2, d3, d4, d5, isnan,
            Assignment([num], "gt", [x, ninf], {}, a.scope),
            Assignment([numf], "tract_core_cast", [num], {"to": working}, a.scope),
            Assignment([mark], "select", [n, two, numf], {}, a.scope),
            Assignment([worst], "max_pool", [mark], dict(a.attrs), a.scope),
            Assignment([value], "max_pool", [x], dict(a.attrs), a.scope),
            Assignment([low], "lt", [worst, 0.5], {}, a.scope),
            Assignment([fixed], "select", [low, yninf, value], {}, a.scope),
            Assignment([bad], "gt", [worst, 1.5], {}, a.scope),
            Assignment([y], "select", [bad, nan, fixed], {}, a.scope),
        ]  # fmt: skip

    return replacing(b, replace)


def text_dtype(dtype: torch.dtype | None) -> str:
    return {torch.float16: "f16", torch.float64: "f64"}.get(dtype, "f32")  # type: ignore[arg-type]


_CAST_INTS = {"i8", "i16", "i32", "i64", "u8", "u16"}
_TORCH_TYPES = {"i8": torch.int8, "i16": torch.int16, "i32": torch.int32, "i64": torch.int64,
                "u8": torch.uint8, "u16": torch.uint16}  # fmt: skip
_SMALL = ("i8", "i16", "u8", "u16")


def torch_casts(b: NNEFBuilder) -> bool:
    """Float → integer casts as torch's x86 kernels: NaN and values out of the conversion's range
    give INT_MIN of the 32-bit (|x| >= 2^31: 8-, 16- and 32-bit targets, whose low bits are then
    0) or the 64-bit conversion (|x| >= 2^63). tract 0.23.9 saturates (NaN → 0, inf → MAX; ``u8``
    of 3e9 is 255, torch 0). A 64-bit cast read only by casts to 8 / 16 bits (``common.cast``
    wraps small types through i64) takes the 32-bit range."""
    if b.precision == "f16":  # |x| <= 65504 there; NaN → 0 is left as tract computes it
        return False
    readers: dict[str, list[Assignment]] = {}
    for a in b.assignments:
        for v in a.args:
            if isinstance(v, Value):
                readers.setdefault(v.name, []).append(a)

    def replace(a: Assignment) -> list[Assignment] | None:
        to = a.attrs.get("to")
        if a.op != "tract_core_cast" or to not in _CAST_INTS or len(a.args) != 1:
            return None
        x, y = a.args[0], a.outputs[0]
        if not isinstance(x, Value) or x.dtype not in (torch.float32, torch.float64):
            return None
        narrow = [r for r in readers.get(y.name, [])]
        via = (
            to == "i64"
            and bool(narrow)
            and all(r.op == "tract_core_cast" and r.attrs.get("to") in _SMALL for r in narrow)
        )
        wide = to == "i64" and not via
        limit = 2.0**63 if wide else 2.0**31
        fill = -(2**63) if wide else -(2**31) if to in ("i32", "i64") else 0
        rank = len(x.shape) if x.shape is not None else 0
        value, define = edit.variable(
            b, torch.full([1] * rank, fill, dtype=_TORCH_TYPES[to]), f"constants/{y.name}_indefinite"
        )
        size, ok, plain = (
            _fresh(b, x, "magnitude"),
            _fresh(b, x, "in_range", torch.bool),
            _fresh(b, y, "cast"),
        )
        return [
            define,
            Assignment([size], "abs", [x], {}, a.scope),
            Assignment([ok], "lt", [size, limit], {}, a.scope),
            Assignment([plain], "tract_core_cast", [x], dict(a.attrs), a.scope),
            Assignment([y], "select", [ok, plain, value], {}, a.scope),
        ]

    return replacing(b, replace)

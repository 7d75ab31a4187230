"""Graph rewrites that steer around tract 0.23 optimizer bugs; each keeps the function exact.

These run after ``passes.optimize`` on every graph but quantized ones (graph.quant names values);
the three around matmuls live in ``nnef/guards_matmul.py``:

- ``merge_duplicates``: identical assignments (same op, operands and attributes) become one.
  tract's own merging of equal nodes leaves a dangling ``Dummy`` op ("eval() called on a Dummy
  op") when three equal nodes exist and the middle one has a consumer; merging them first means
  tract never sees the pattern (and the graph is smaller).
- ``exact_quotients``: tract divides floats as ``x * recip(y)``, which is not correctly rounded
  (``x / |x|`` can be 0.99999994). A float32 quotient that a discontinuous op reads (floor,
  ceil, round, sign, comparisons, casts to integers) is computed in float64 and rounded once,
  so ``floor(x / y)`` is torch's; other quotients keep tract's ≤ 1 ulp error and its speed.
- ``flat_matmul_after_reshape``: tract folds a ``reshape`` of a matmul's input into its einsum
  and applies it to the constant operand's broadcast leading axes as well ("Incompatible
  reshape for shape [1, K, N]"); such a matmul runs on ``[-1, K]`` × ``[K, N]`` instead.
  Scoped to reshapes that change the batch axes: the guard costs 1–4 % on transformer
  encoders, where the reshape before the output projection only merges heads.
- ``broadcast_after_matmul``: a matmul input broadcast on batch axes (``expand``) makes tract's
  einsum declutter lose the broadcast size ("Trying to substitute a 2,5,… by 1,5,…"); the
  matmul runs on the unbroadcast input and its result is broadcast, which is the same tensor.
- ``broadcast_as_product``: tract's ``ConcatThenEinsum`` split of a matmul over a key that is
  ``concat([k, broadcast(concat([cache, new]))])`` on the reduced axis (DeepSeek's MLA, its
  shared rotary key broadcast over heads) wires an einsum piece with an input of the wrong rank
  ("in output_facts invocation for ….concat-einsum-k.4..8: EinSum … fact.len() ==
  self.axes.rank"). The broadcast becomes a product with a broadcast of ones, the same tensor,
  which tract splits; scoped to broadcasts of a concat, read by a concat that a matmul reads.
- ``broadcast_into_concat_einsum`` (``nnef/guards_einsum.py``): a ``tile`` / broadcast of size-1
  axes concatenated into a conv or matmul (ECAPA-TDNN's ``cat([x, mean.repeat(1, 1, T)])``):
  tract's einsum declutter drops the broadcast of its concat piece and the output loses the
  axis ("Trying to substitute a 16,100,F32 by 16,1,F32"); it becomes a product with ones.
- ``gather_strided_after_softmax``: tract pulls a strided slice (its ``Downsample``) up through
  ``softmax`` / ``log_softmax`` as if they were elementwise, so ``softmax(x)[::2]`` becomes
  ``softmax(x[::2])``. A strided slice that such a pull could reach a softmax from becomes a
  ``tract_core_gather`` of constant indices, which tract does not move.
- ``gather_strided_after_split``: tract's declutter pulls a strided slice over a ``reshape`` that
  split an axis and fails to load ("Pulling Downsample over Reshape: Invalid axis"; LeViT's
  ``x.view(B, 4, 4, C)[:, ::2, ::2]``), or over one that merged axes (``x.flatten()[-3::2]``, found
  by the value-dependence fuzz). A strided slice that such a pull reaches the reshape from becomes
  the same constant gathers.
- ``wide_extrema`` (runs *before* the passes, so ``rows`` can still pool the widened max):
  tract's ``max_reduce`` / ``min_reduce`` (and the ``max_pool`` form) start from the type's
  finite extreme, so a row of only ``-inf`` comes back as ``-3.4028235e38`` (f16: ``-65504``)
  where torch gives ``-inf``, a finite wrong number no random check finds. The reduction runs
  one float type wider and is cast back: the wide type's start value overflows to ``∓inf``
  in the cast, every other result is exact. Measured single-threaded against the f32 reduce:
  [1, 512, 7, 7] over H, W 326 → 138 µs, [4, 64, 32] last axis as pool 21.6 → 23.2 µs.
- ``exact_windows`` (``nnef/guards_windows.py``): a strided conv or pool on a size ``8 * h``
  reads no trailing padding past its last window, so tract's ``(in + pad - k) / s`` is exact
  (it cannot simplify ``(7 + 8*h) / 8`` to ``h``, and a U-Net's decoder then fails to load).
- ``normal_weights`` (``nnef/guards_matmul.py``): tract's matmul / conv kernels flush denormal
  operands (``inf · 1e-45`` in a dot product is NaN, torch inf): float32 denormals of a constant
  matmul / conv operand are stored as ±the smallest normal.
- ``empty_reductions``: tract's ``sum_reduce`` / ``mean_reduce`` over an axis of size 0 panics
  ("attempt to divide by zero" in its sum kernel) and aborts the process. Such a reduction is
  torch's empty sum (0) or empty mean (NaN) broadcast to the result's shape.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from torchlower.core.values import Value
from torchlower.nnef import graph_edit as edit
from torchlower.nnef import guards_values, text
from torchlower.nnef.builder import NNEFBuilder
from torchlower.nnef.guards_einsum import broadcast_into_concat_einsum
from torchlower.nnef.guards_matmul import (
    broadcast_after_matmul,
    broadcast_as_product,
    flat_matmul_after_reshape,
    normal_weights,
    replacing,
)
from torchlower.nnef.guards_windows import exact_windows

Assignment = text.Assignment
_SOURCES = ("external", "tract_core_external", "variable")  # distinct even when spelled alike
_SOFTMAX = ("softmax", "tract_core_log_softmax")
_PULL_DEPTH = 16  # how far up a chain of single-use producers a pull is followed
_EXTREMA = ("max_reduce", "min_reduce")
_WIDER = {torch.float32: (torch.float64, "f64", "f32"), torch.float16: (torch.float32, "f32", "f16")}


def apply(b: NNEFBuilder) -> None:
    """Every guard, in order; the builder's assignments are replaced."""
    exact_windows(b)  # names no new value in quantized graphs (their graph.quant names values)
    normal_weights(b)  # changes stored values only
    if b.quantization:
        return
    merge_duplicates(b)
    empty_reductions(b)
    exact_quotients(b)
    broadcast_after_matmul(b)
    broadcast_as_product(b)
    broadcast_into_concat_einsum(b)
    flat_matmul_after_reshape(b)
    gather_strided_after_softmax(b)
    gather_strided_after_split(b)
    b.assignments = b.live_assignments()


def before_passes(b: NNEFBuilder) -> None:
    """The guards whose rewrite the passes should see (and may optimize further)."""
    if b.quantization:
        return
    if b.clamps:  # equal nodes merged first: a clamp's operand shared after merging is not fused
        merge_duplicates(b)
    guards_values.apply_before_passes(b)  # NaN, ±inf and tails as torch (nnef/guards_values.py)
    wide_extrema(b)


def wide_extrema(b: NNEFBuilder) -> bool:
    """A float ``max_reduce`` / ``min_reduce`` runs one type wider, so an all-``∓inf`` row stays infinite."""
    return replacing(b, lambda a: _widened(b, a))


def _widened(b: NNEFBuilder, a: Assignment) -> list[Assignment] | None:
    x = a.args[0] if a.op in _EXTREMA and len(a.args) == 1 and len(a.outputs) == 1 else None
    if not isinstance(x, Value) or x.dtype not in _WIDER or a.outputs[0].dtype != x.dtype:
        return None
    wide, to_wide, back = _WIDER[x.dtype]
    if b.precision == "f16" and x.dtype == torch.float32:  # typed f32, f16 in tract: f16 → f32 → f16
        wide, to_wide, back = torch.float64, "f32", "f16"
    y = a.outputs[0]
    xw = Value(b.fresh(f"{x.name}_{to_wide}"), wide, x.shape)
    yw = Value(b.fresh(f"{y.name}_{to_wide}"), wide, y.shape)
    return [
        Assignment([xw], "tract_core_cast", [x], {"to": to_wide}, a.scope),
        Assignment([yw], a.op, [xw], dict(a.attrs), a.scope),
        Assignment([y], "tract_core_cast", [yw], {"to": back}, a.scope),
    ]


def _key(item: Any) -> Any:
    """A hashable spelling of an operand or attribute that tells ``-0.0`` from ``0.0`` and NaN from NaN."""
    if isinstance(item, Value):
        return ("value", item.name)
    if isinstance(item, float):
        return ("float", repr(item))
    if isinstance(item, (list, tuple)):
        return ("list", tuple(_key(i) for i in item))
    if isinstance(item, dict):
        return ("dict", tuple((k, _key(v)) for k, v in sorted(item.items())))
    return (type(item).__name__, repr(item))


def merge_duplicates(b: NNEFBuilder) -> bool:
    """Later copies of an assignment are replaced by the first one's outputs."""
    first: dict[Any, Assignment] = {}
    renames: dict[str, Value] = {}
    for a in b.assignments:
        if a.op.startswith(_SOURCES) or not a.args:
            continue
        args = [renames.get(x.name, x) if isinstance(x, Value) else x for x in a.args]
        key = (a.op, _key(args), _key(a.attrs), len(a.outputs))
        kept = first.setdefault(key, a)
        if kept is not a and all(o.dtype == k.dtype for o, k in zip(a.outputs, kept.outputs, strict=True)):
            renames.update({o.name: k for o, k in zip(a.outputs, kept.outputs, strict=True)})
    edit.substitute(b, renames)
    return bool(renames)


_DISCONTINUOUS = {
    "floor",
    "ceil",
    "round",
    "tract_core_round_even",
    "sign",
    "lt",
    "gt",
    "le",
    "ge",
    "eq",
    "ne",
}
_INTEGER_TYPES = {"i8", "i16", "i32", "i64", "u8", "u16", "u32", "u64", "bool"}


_EMPTY_REDUCTION = {"sum_reduce": 0.0, "mean_reduce": float("nan")}


def empty_reductions(b: NNEFBuilder) -> bool:
    """A sum / mean over a static zero-size axis becomes its value broadcast (0 or NaN)."""
    return replacing(b, lambda a: _empty_reduction(b, a))


def _empty_reduction(b: NNEFBuilder, a: Assignment) -> list[Assignment] | None:
    x, y = (a.args[0] if a.args else None), a.outputs[0]
    if a.op not in _EMPTY_REDUCTION or not isinstance(x, Value) or x.shape is None or y.shape is None:
        return None
    if not any(x.shape[axis] == 0 for axis in a.attrs.get("axes", [])):
        return None
    fill = torch.full([1] * len(y.shape), _EMPTY_REDUCTION[a.op], dtype=y.dtype or torch.float32)
    value, define = edit.variable(b, fill, f"constants/{y.name}_empty")
    return [define, Assignment([y], "tract_core_broadcast", [value], {"shape": list(y.shape)})]


def _discontinuous(a: Assignment) -> bool:
    return a.op in _DISCONTINUOUS or (a.op == "tract_core_cast" and a.attrs.get("to") in _INTEGER_TYPES)


def exact_quotients(b: NNEFBuilder) -> bool:
    """float32 ``div``s read by a discontinuous op run in float64 (one rounding, like torch)."""
    producers = edit.producers(b)
    chosen = {
        id(p)
        for a in b.assignments
        if _discontinuous(a)
        for arg in a.args
        if isinstance(arg, Value)
        and (p := producers.get(arg.name)) is not None
        and p.op == "div"
        and p.outputs[0].dtype == torch.float32
    }
    return replacing(b, lambda a: _in_float64(b, a) if id(a) in chosen else None)


def _in_float64(b: NNEFBuilder, a: Assignment) -> list[Assignment]:
    """``a`` (a float32 ``div``) on float64 casts of its operands, cast back to float32."""
    steps: list[Assignment] = []
    wide = []
    for arg in a.args:
        if isinstance(arg, Value):
            v = Value(b.fresh(f"{arg.name}_f64"), torch.float64, arg.shape)
            steps.append(Assignment([v], "tract_core_cast", [arg], {"to": "f64"}))
            arg = v
        wide.append(arg)
    result = a.outputs[0]
    q = Value(b.fresh(f"{result.name}_f64"), torch.float64, result.shape)
    steps.append(Assignment([q], a.op, wide, dict(a.attrs)))
    steps.append(Assignment([result], "tract_core_cast", [q], {"to": "f32"}))
    return steps


def gather_strided_after_softmax(b: NNEFBuilder) -> bool:
    """A strided slice that tract could pull into a softmax becomes slice + constant gathers."""
    producers, uses = edit.producers(b), edit.uses(b)

    def replace(a: Assignment) -> list[Assignment] | None:
        if a.op == "slice" and _strided(a) and _reaches_softmax(a.args[0], producers, uses):
            return _as_gathers(b, a)
        return None

    return replacing(b, replace)


def gather_strided_after_split(b: NNEFBuilder) -> bool:
    """A strided slice that tract would pull over an axis-splitting or -merging reshape becomes gathers."""
    producers, uses = edit.producers(b), edit.uses(b)

    def replace(a: Assignment) -> list[Assignment] | None:
        if a.op == "slice" and _strided(a) and _reaches(a.args[0], producers, uses, _splits_an_axis):
            return _as_gathers(b, a)
        return None

    return replacing(b, replace)


def _splits_an_axis(a: Assignment) -> bool:
    """A reshape that splits or merges axes: to a higher rank (``[B, 16, C]`` → ``[B, 4, 4, C]``)
    or a lower one (``flatten``: ``[4, 2]`` → ``[8]``, the fuzzer's ``x.flatten()[-3::2]``)."""
    if a.op != "reshape" or not a.args or not isinstance(a.args[0], Value) or a.args[0].shape is None:
        return False
    return len(a.attrs.get("shape", ())) != len(a.args[0].shape)


def _strided(a: Assignment) -> bool:
    return any(s != 1 for s in a.attrs.get("stride", []))


def _reaches_softmax(x: Any, producers: dict[str, Assignment], uses: dict[str, int]) -> bool:
    """Whether a softmax sits above ``x`` on a path of single-use values (tract's pull path)."""
    return _reaches(x, producers, uses, lambda p: p.op in _SOFTMAX)


def _reaches(
    x: Any, producers: dict[str, Assignment], uses: dict[str, int], match: Callable[[Assignment], bool]
) -> bool:
    """Whether an assignment ``match`` accepts sits above ``x`` on a path of single-use values."""
    frontier, depth = [x], 0
    while frontier and depth < _PULL_DEPTH:
        step = []
        for v in frontier:
            p = producers.get(v.name) if isinstance(v, Value) else None
            if p is None or uses[v.name] != 1:
                continue
            if match(p):
                return True
            step += [arg for arg in p.args if isinstance(arg, Value)]
        frontier, depth = step, depth + 1
    return False


def _as_gathers(b: NNEFBuilder, a: Assignment) -> list[Assignment] | None:
    """``slice`` with strides → stride-1 ``slice`` then one ``tract_core_gather`` per strided axis."""
    x, out = a.args[0], a.outputs[0]
    axes, begin, end = a.attrs["axes"], a.attrs["begin"], a.attrs["end"]
    stride = a.attrs["stride"]
    bounds = [*begin, *end, *stride]
    if not all(isinstance(i, int) for i in bounds) or any(s < 1 for s in stride) or x.shape is None:
        return None  # symbolic or reversed bounds: left as they are
    steps: list[Assignment] = []
    shape = list(x.shape)
    for axis, lo, hi in zip(axes, begin, end, strict=True):
        shape[axis] = hi - lo
    current = Value(b.fresh(f"{out.name}_range"), x.dtype, tuple(shape))
    steps.append(Assignment([current], "slice", [x], {"axes": list(axes), "begin": begin, "end": end}))
    for axis, s in zip(axes, stride, strict=True):
        if s == 1:
            continue
        picks = torch.arange(0, shape[axis], s, dtype=torch.int64)
        index, define = edit.variable(b, picks, f"constants/{out.name}")
        shape[axis] = len(picks)
        gathered = Value(b.fresh(f"{out.name}_picked"), x.dtype, tuple(shape))
        steps += [define, Assignment([gathered], "tract_core_gather", [current, index], {"axis": axis})]
        current = gathered
    steps[-1].outputs = [out]  # the last gather defines ``out`` itself: consumers keep their operand
    return steps

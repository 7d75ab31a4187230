"""Graph edits so that tract's ``detect_kv_cache`` sees every cache of partial-rotary models.

With partial rotary (Phi, GPT-NeoX) the query is ``concat([rotated, passed], axis=-1)``
and feeds ``q · kᵀ`` whose key is the cache concat. tract's optimizer pass
``ConcatThenEinsum`` (core/src/optim/concat_then_einsum.rs) splits an einsum whose input is
a concat along a summed axis into one einsum per piece, slicing the other operand; the
slices of the key are then pushed through the cache concat, so the cache input gets more
than one successor and ``replace_kv_cache`` (transformers/src/ops/dyn_kv_cache.rs, which
wants source → one concat → output) no longer matches: the model ran with explicit caches.

Here such a query concat is written as a sum of zero-padded pieces, ``pad(a) + pad(b)``:
the same numbers (each element is a piece's value plus an exact 0), not a concat, so tract
keeps one einsum and the cache pattern survives.
"""

from __future__ import annotations

from typing import Any

from torchlower.core.values import Value
from torchlower.nnef import text

_PASS_THROUGH = ("reshape", "tract_core_broadcast", "transpose")


def unsplit_query_concats(builder: Any) -> int:
    """Rewrite each ``matmul(concat(pieces, last axis), K)`` with ``K`` a cache output; returns how many."""
    producers = {v.name: a for a in builder.assignments for v in a.outputs}
    outputs = {v.name for _, v in builder.outputs}
    done = 0
    result: list[Any] = []
    for a in builder.assignments:
        if a.op == "matmul" and not a.attrs.get("transposeA") and len(a.args) == 2:
            query, key = a.args
            concat = producers.get(query.name) if isinstance(query, Value) else None
            if concat is not None and _last_axis_concat(concat) and _from_cache(key, producers, outputs):
                a.args = [_padded_sum(builder, concat, result), key]
                done += 1
        result.append(a)
    builder.assignments = result
    return done


def _last_axis_concat(a: Any) -> bool:
    if a.op != "concat" or not a.args or not isinstance(a.args[0], (list, tuple)):
        return False
    pieces = a.args[0]
    shapes = [getattr(p, "shape", None) for p in pieces]
    if len(pieces) < 2 or any(s is None or not isinstance(s[-1], int) for s in shapes):
        return False
    return a.attrs.get("axis") in (-1, len(shapes[0]) - 1)


def _from_cache(value: Any, producers: dict[str, Any], outputs: set[str]) -> bool:
    while isinstance(value, Value):
        if value.name in outputs:
            return True
        a = producers.get(value.name)
        if a is None or a.op not in _PASS_THROUGH:
            return False
        value = a.args[0]
    return False


def _padded_sum(builder: Any, concat: Any, result: list[Any]) -> Value:
    pieces = concat.args[0]
    out = concat.outputs[0]
    widths = [int(p.shape[-1]) for p in pieces]
    total = sum(widths)
    summed: Value | None = None
    start = 0
    for piece, width in zip(pieces, widths, strict=True):
        padding = [(0, 0)] * (len(piece.shape) - 1) + [(start, total - start - width)]
        attrs = {"padding": padding, "border": "constant", "value": 0.0}
        padded = Value(builder.fresh(f"{out.name}_part"), out.dtype, out.shape)
        result.append(text.Assignment([padded], "pad", [piece], attrs, concat.scope))
        if summed is not None:
            total_value = Value(builder.fresh(f"{out.name}_sum"), out.dtype, out.shape)
            result.append(text.Assignment([total_value], "add", [summed, padded], {}, concat.scope))
            padded = total_value
        summed = padded
        start += width
    assert summed is not None
    return summed

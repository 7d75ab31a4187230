"""A broadcast read through a concat by a conv or matmul: written as a product with ones.

tract 0.23.9 splits an einsum over a concatenated operand into one einsum per piece
(``ConcatThenEinsum``), then ``EinSum::declutter_broadcast`` drops a ``MultiBroadcastTo`` that
feeds a piece (a ``tile`` of a size-1 axis is one) as if the einsum broadcast that axis itself.
When the axis reaches the output from that piece alone, the output loses it and the model fails
to load: "Trying to substitute a 16,100,F32 by 16,1,F32 as output #0 of
….concat-einsum-I.16..32 EinSum". ECAPA-TDNN's attentive statistics pooling (speechbrain) does
exactly this: ``cat([x, mean.repeat(1, 1, T), std.repeat(1, 1, T)], 1)`` into a 1×1 conv.

Such a broadcast becomes ``x · broadcast(1.0)``, the same tensor (NaN and -0.0 included), which
tract keeps as a ``Mul`` and splits correctly. Scoped to ``tile`` / ``tract_core_broadcast`` that
only repeat size-1 axes, read by a ``concat`` that a ``conv`` or ``matmul`` reads.
"""

from __future__ import annotations

from torchlower.core.values import Value
from torchlower.nnef import graph_edit as edit
from torchlower.nnef import text
from torchlower.nnef.builder import NNEFBuilder
from torchlower.nnef.guards_matmul import replacing

Assignment = text.Assignment
_EINSUMS = ("conv", "matmul")  # what tract declutters into an EinSum


def broadcast_into_concat_einsum(b: NNEFBuilder) -> bool:
    """``tile`` / ``broadcast`` of size-1 axes, concatenated into a conv or matmul → ``x · ones``."""
    readers: dict[str, list[Assignment]] = {}
    for a in b.assignments:
        for v in [*a.args, *(x for arg in a.args if isinstance(arg, list) for x in arg)]:
            if isinstance(v, Value):
                readers.setdefault(v.name, []).append(a)
    producers = edit.producers(b)

    def into_einsum(v: Value) -> bool:
        concats = [r for r in readers.get(v.name, []) if r.op == "concat"]
        return any(m.op in _EINSUMS for c in concats for m in readers.get(c.outputs[0].name, []))

    def replace(a: Assignment) -> list[Assignment] | None:
        if a.op not in ("tile", "tract_core_broadcast") or not into_einsum(a.outputs[0]):
            return None
        src = a.args[0] if a.args else None
        inner = producers.get(src.name) if isinstance(src, Value) else None
        if a.op == "tract_core_broadcast" and inner is not None and inner.op == "concat":
            return None  # guards_matmul.broadcast_as_product's case
        return _as_product(b, a)

    return replacing(b, replace)


def _as_product(b: NNEFBuilder, a: Assignment) -> list[Assignment] | None:
    src = a.args[0]
    if not isinstance(src, Value) or src.shape is None or not (src.dtype and src.dtype.is_floating_point):
        return None
    if a.op == "tile":
        repeats = list(a.attrs.get("repeats", []))
        if len(repeats) != len(src.shape):
            return None
        if any(r != 1 and d != 1 for d, r in zip(src.shape, repeats, strict=True)):
            return None  # a tile of a longer axis is no broadcast
        ones_shape = list(repeats)
    else:
        target = list(a.attrs.get("shape", []))
        if len(target) != len(src.shape):
            return None
        ones_shape = [t if d == 1 else 1 for d, t in zip(src.shape, target, strict=True)]
    if all(isinstance(d, int) and d == 1 for d in ones_shape):
        return None
    ones = Value(b.fresh(f"{src.name}_ones"), src.dtype, tuple(ones_shape))
    return [
        Assignment([ones], "tract_core_broadcast", [1.0], {"shape": ones_shape}, a.scope),
        Assignment(list(a.outputs), "mul", [src, ones], {}, a.scope),
    ]

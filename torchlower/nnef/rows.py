"""Row reductions over the last axis in the forms tract 0.23.9 runs fastest (f32, static shapes).

tract's ``Reduce<Max>`` slices its input once per output element (about 0.5 µs a row plus a
scalar fold) and its ``Softmax`` walks rows one by one with a slow path for a row tail that is
not a multiple of 64 floats, while ``max_pool``, ``exp``, ``sum_reduce`` and broadcast
arithmetic run vectorised over the whole tensor. Measured single-threaded (bench/ab.py style,
interleaved medians, load ~9):

=================  ========  ==================  ====================
shape              softmax   max_pool form       padded to 64 columns
=================  ========  ==================  ====================
[1, 4, 16, 16]     37 µs     20 µs               –
[4, 64, 32]        110 µs    37 µs               –
[1, 4, 64, 64]     110 µs    84 µs               –
[1, 4, 128, 128]   227 µs    301 µs              –
[1, 4, 159, 159]   794 µs    469 µs              365 µs
=================  ========  ==================  ====================

So rows up to ``POOL_MAX_ROW`` use the max_pool form, longer ragged rows are padded, and every
last-axis ``max_reduce`` (f32, or the f64 one of ``guards.wide_extrema``) becomes a ``max_pool``
(bit-identical to tract's ``max_reduce``, checked with NaN, ±inf and all ``-inf`` rows; 37 → 7 µs
on [1, 4, 16, 16]).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from torchlower.core.values import Value
from torchlower.nnef import graph_edit as edit
from torchlower.nnef import text
from torchlower.nnef.builder import NNEFBuilder

Assignment = text.Assignment
ROW_ALIGN = 64  # tract's softmax kernel runs whole rows of 64 floats fast, a ragged tail slowly
POOL_MAX_ROW = 64  # up to this row length the max_pool form beat tract's softmax


def apply(b: NNEFBuilder) -> bool:
    changed = pad_softmax_rows(b)
    changed |= softmax_by_pool(b)
    return max_by_pool(b) or changed


def _last_axis_f32(
    a: Assignment, op: str, dtypes: tuple[torch.dtype, ...] = (torch.float32,)
) -> list[int] | None:
    """The static shape of ``a``'s input when ``a`` is ``op`` over the last axis of an f32 tensor
    (or of one of ``dtypes``: the max of ``guards.wide_extrema`` is f64)."""
    x = a.args[0] if a.op == op and len(a.args) == 1 else None
    shape = edit.static(x.shape) if isinstance(x, Value) and x.dtype in dtypes else None
    if not shape or a.attrs.get("axes") != [len(shape) - 1] or shape[-1] < 1:
        return None
    return shape


def _row_max(
    b: NNEFBuilder, x: Value, shape: list[int], hint: str, scope: str, out: list[Assignment]
) -> Value:
    """``max_reduce(x, axes=[-1])`` as a ``max_pool`` (rank 3-5 directly, others through a reshape:
    tract's pooling wants a batch and a channel axis and crashes on a rank-2 input)."""
    rank, n = len(shape), shape[-1]
    kept = tuple([*shape[:-1], 1])
    src, pool_shape = x, shape
    if not 3 <= rank <= 5:
        pool_shape = [1, math.prod(shape[:-1]), n]
        src = Value(b.fresh(f"{hint}_rows"), x.dtype, tuple(pool_shape))
        out.append(Assignment([src], "reshape", [x], {"shape": pool_shape}, scope))
    r = len(pool_shape)
    pooled = Value(b.fresh(f"{hint}_max"), x.dtype, tuple([*pool_shape[:-1], 1]))
    attrs = {
        "size": [1] * (r - 1) + [n],
        "border": "ignore",
        "padding": [(0, 0)] * r,
        "stride": [1] * r,
    }
    out.append(Assignment([pooled], "max_pool", [src], attrs, scope))
    if src is x:
        return pooled
    back = Value(b.fresh(f"{hint}_max"), x.dtype, kept)
    out.append(Assignment([back], "reshape", [pooled], {"shape": list(kept)}, scope))
    return back


def max_by_pool(b: NNEFBuilder) -> bool:
    """``max_reduce(x, axes=[-1])`` → ``max_pool`` over the last axis (same numbers as tract's reduce)."""

    def step(a: Assignment, out: list[Assignment]) -> bool:
        shape = _last_axis_f32(a, "max_reduce", (torch.float32, torch.float64))
        if shape is None or len(a.outputs) != 1:
            out.append(a)
            return False
        _row_max(b, a.args[0], shape, a.outputs[0].name, a.scope, out)
        out[-1].outputs = list(a.outputs)  # the last op of the pool form yields the reduce's value
        return True

    return edit.rewrite(b, step)


def softmax_by_pool(b: NNEFBuilder) -> bool:
    """``softmax(x, axes=[-1])`` with rows up to ``POOL_MAX_ROW`` → ``e = exp(x - rowmax); e / Σe``.

    The same arithmetic as a softmax; NaN and ±inf behave as in PyTorch: a row with NaN or +inf
    gives NaN, an all ``-inf`` row gives NaN (0/0), an all ``finfo.min`` row gives 1/n.
    """

    def step(a: Assignment, out: list[Assignment]) -> bool:
        shape = _last_axis_f32(a, "softmax")
        if shape is None or shape[-1] > POOL_MAX_ROW or len(a.outputs) != 1:
            out.append(a)
            return False
        x, y = a.args[0], a.outputs[0]
        m = _row_max(b, x, shape, y.name, a.scope, out)
        d = Value(b.fresh(f"{y.name}_shifted"), torch.float32, tuple(shape))
        e = Value(b.fresh(f"{y.name}_exp"), torch.float32, tuple(shape))
        s = Value(b.fresh(f"{y.name}_sum"), torch.float32, tuple([*shape[:-1], 1]))
        out.append(Assignment([d], "sub", [x, m], {}, a.scope))
        out.append(Assignment([e], "exp", [d], {}, a.scope))
        out.append(Assignment([s], "sum_reduce", [e], {"axes": [len(shape) - 1]}, a.scope))
        out.append(Assignment([y], "div", [e, s], {}, a.scope))
        return True

    return edit.rewrite(b, step)


def _aligned_length(n: int) -> int | None:
    """The padded row length for a softmax row of ``n``, or None where padding was not faster.

    Rows up to ``POOL_MAX_ROW`` take the max_pool form instead; multiples of 64 are fast as
    they are. 636 rows of 159: 794 µs plain, 365 µs padded to 192 (pad, mask add and slice).
    """
    if n <= POOL_MAX_ROW or n % ROW_ALIGN == 0:
        return None
    return -(-n // ROW_ALIGN) * ROW_ALIGN


def _zero_pad(pads: list[tuple[int, int]]) -> dict[str, Any]:
    return {"padding": pads, "border": "constant", "value": 0.0}


def pad_softmax_rows(b: NNEFBuilder) -> bool:
    """``softmax(x, axes=[-1])`` → ``softmax(pad(x) + M)`` on rows padded to a multiple of 64.

    The pad is 0.0 and ``M`` adds ``-inf`` to the padded columns only (NNEF has no ``-inf``
    literal, so it sits in a small constant), so every padded weight is exactly
    ``exp(-inf) = 0`` and the real ones are the unpadded softmax: a row of all ``-inf`` still
    gives NaN and a row of all ``finfo.min`` still gives 1/n, as in PyTorch. When the softmax
    feeds ``matmul(weights, v)`` (attention), ``v`` gets zero rows instead of slicing the
    weights back (a smaller copy); otherwise the padded columns are sliced off.
    """
    uses = edit.uses(b)
    consumers = {x.name: a for a in b.assignments for x in a.args if isinstance(x, Value)}
    changed = False

    def step(a: Assignment, out: list[Assignment]) -> bool:
        nonlocal changed
        if id(a) in retarget:
            out.extend(retarget.pop(id(a)))
            return True
        shape = _last_axis_f32(a, "softmax")
        padded = _aligned_length(shape[-1]) if shape is not None else None
        if shape is None or padded is None:
            out.append(a)
            return False
        x, n, rank, y = a.args[0], shape[-1], len(shape), a.outputs[0]
        pads = [(0, 0)] * (rank - 1) + [(0, padded - n)]
        wide = [*shape[:-1], padded]
        p = Value(b.fresh(f"{y.name}_rows"), torch.float32, tuple(wide))
        out.append(Assignment([p], "pad", [x], _zero_pad(pads), a.scope))
        tail = torch.zeros([1] * (rank - 1) + [padded])
        tail[..., n:] = -math.inf
        m, define = edit.variable(b, tail, f"constants/{y.name}_row_tail")
        out.append(define)
        p2 = Value(b.fresh(f"{y.name}_rows"), torch.float32, tuple(wide))
        out.append(Assignment([p2], "add", [p, m], {}, a.scope))
        s = Value(b.fresh(f"{y.name}_rows"), torch.float32, tuple(wide))
        out.append(Assignment([s], "softmax", [p2], dict(a.attrs), a.scope))
        mm = consumers.get(y.name) if uses[y.name] == 1 else None
        v = mm.args[1] if mm is not None and mm.op == "matmul" and len(mm.args) == 2 else None
        vs = edit.static(v.shape) if isinstance(v, Value) and v.dtype == torch.float32 else None
        if (
            mm is not None
            and isinstance(mm.args[0], Value)
            and mm.args[0].name == y.name
            and v.name != y.name
            and not mm.attrs.get("transposeA")
            and not mm.attrs.get("transposeB")
            and vs is not None
            and len(vs) == rank
            and vs[-2] == n
        ):
            vp = Value(b.fresh(f"{v.name}_rows"), torch.float32, (*vs[:-2], padded, vs[-1]))
            vpads = [(0, 0)] * (rank - 2) + [(0, padded - n), (0, 0)]
            pad_v = Assignment([vp], "pad", [v], _zero_pad(vpads), a.scope)
            retarget[id(mm)] = [pad_v, Assignment(mm.outputs, "matmul", [s, vp], dict(mm.attrs), mm.scope)]
        else:
            end = {"axes": [rank - 1], "begin": [0], "end": [n]}
            out.append(Assignment([y], "slice", [s], end, a.scope))
        changed = True
        return True

    retarget: dict[int, list[Assignment]] = {}
    edit.rewrite(b, step)
    return changed

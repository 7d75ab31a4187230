"""``torchlower::linear_scan`` (``core/scan_ops.py``: the recurrence of Mamba layers) for tract.

``h_t = a_t · h_{t-1} + u_t``, ``y_t = Σ_n h_t[…, n] · c_t[…, n]``, time on axis 1: one
``tract_core_scan`` loop whose body is that step, so one graph runs a prefill of any length and
a one-token decode, from any initial state. Khronos-only NNEF has no loop: there the static
length is unrolled.
"""

from __future__ import annotations

import torch

from torchlower.core import scan_ops  # noqa: F401  (registers the op the rule is keyed by)
from torchlower.core.values import Dim, Value
from torchlower.rules import rule
from torchlower.rules.common import Builder, shape_of


def _call(b: Builder, op: str, args: list[Value], shape: tuple[Dim, ...], **attrs: object) -> Value:
    return b.call(op, args, dict(attrs), dtype=args[0].dtype, shape=shape)


def _step(b: Builder, a: Value, u: Value, c: Value, h: Value) -> tuple[Value, Value]:
    """One step on [B, 1, …] slices: the new state and its read-out (the last axis summed)."""
    state = shape_of(h)
    h_new = _call(b, "add", [_call(b, "mul", [a, h], state), u], state)
    summed = _call(
        b, "sum_reduce", [_call(b, "mul", [h_new, c], state)], (*state[:-1], 1), axes=[len(state) - 1]
    )
    y = _call(b, "squeeze", [summed], state[:-1], axes=[len(state) - 1])
    return h_new, y


def _unsqueeze(b: Builder, x: Value, axis: int) -> Value:
    shape = list(shape_of(x))
    shape.insert(axis, 1)
    return _call(b, "unsqueeze", [x], tuple(shape), axes=[axis])


def _slice(b: Builder, x: Value, t: int) -> Value:
    shape = list(shape_of(x))
    shape[1] = 1
    return _call(b, "slice", [x], tuple(shape), axes=[1], begin=[t], end=[t + 1])


@rule("torchlower::linear_scan")
def linear_scan(b: Builder, a: Value, u: Value, c: Value, h0: Value) -> tuple[Value, Value]:
    """linear_scan(Tensor a, Tensor u, Tensor c, Tensor h0) -> (Tensor, Tensor)"""
    a, u, c = (_full_rank(b, v, h0.rank + 1) for v in (a, u, c))
    batch, length = shape_of(u)[0], shape_of(u)[1]
    state = (batch, 1, *shape_of(h0)[1:])
    y_shape = (batch, length, *shape_of(h0)[1:-1])
    h = _unsqueeze(b, b.tensor(h0), 1)
    if not b.tract:  # no loop op: unroll the static length
        ys = []
        for t in range(int(length)):
            h, y = _step(b, _slice(b, a, t), _slice(b, u, t), _slice(b, c, t), h)
            ys.append(y)
        y_all = ys[0] if len(ys) == 1 else b.call("concat", [ys], {"axis": 1}, dtype=h0.dtype, shape=y_shape)
        return y_all, _call(b, "squeeze", [h], shape_of(h0), axes=[1])
    params = [
        (name, v.dtype or torch.float32, (*shape_of(v)[:1], 1, *shape_of(v)[2:]))
        for name, v in (("a", a), ("u", u), ("c", c))
    ]
    params.append(("h", h0.dtype or torch.float32, state))

    def body(sub: Builder, values: list[Value]) -> list[Value]:
        return list(_step(sub, *values))

    frag = b.fragment("linear_scan_body", params, body)
    attrs = {
        "body": frag.name,
        "scan": [(frag.params[i], v, 1, 1) for i, v in enumerate((a, u, c))],
        "full": list(frag.captures),
        "state": [(frag.params[3], h, frag.results[0])],
        "output": [(frag.results[1], "full", 1, 1), (frag.results[0], "last", 1, 1)],
    }
    y_all, h_last = b.call_multi("tract_core_scan", [], attrs, 2)
    y_all = y_all.with_meta(h0.dtype, y_shape)
    h_last = h_last.with_meta(h0.dtype, state)
    return y_all, _call(b, "squeeze", [h_last], shape_of(h0), axes=[1])


def _full_rank(b: Builder, x: Value, rank: int) -> Value:
    """``x`` with the state's rank (leading axes kept, ones inserted after the time axis), as a
    graph tensor: the scan slices it along axis 1."""
    x = b.tensor(x)
    while x.rank < rank:
        x = _unsqueeze(b, x, 2)
    return x

"""``torchlower::linear_scan`` and ``torchlower::delta_scan`` (``core/scan_ops.py``: the
recurrences of Mamba layers and of Qwen3-Next's gated delta net) for tract.

``linear_scan``: ``h_t = a_t · h_{t-1} + u_t``, ``y_t = Σ_n h_t[…, n] · c_t[…, n]``;
``delta_scan``: ``h = h·decay``, ``h += k ⊗ β(v − hᵀk)``, ``o = hᵀq``; time on axis 1. Each is
one ``tract_core_scan`` loop whose body is one step, so one graph runs a prefill of any length
and a one-token decode, from any initial state. Khronos-only NNEF has no loop: there the static
length is unrolled.
"""

from __future__ import annotations

from collections.abc import Callable

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


def _delta_step(
    b: Builder, decay: Value, beta: Value, q: Value, k: Value, v: Value, h: Value
) -> tuple[Value, Value]:
    """One gated-delta step on [B, 1, …] slices: the new state and ``hᵀq``."""
    state = shape_of(h)
    axis = len(state) - 2  # Dk
    row = (*state[:axis], 1, state[-1])
    h = _call(b, "mul", [h, decay], state)
    memory = _call(b, "sum_reduce", [_call(b, "mul", [h, k], state)], row, axes=[axis])
    delta = _call(b, "mul", [_call(b, "sub", [v, memory], row), beta], row)
    h = _call(b, "add", [h, _call(b, "mul", [k, delta], state)], state)
    out = _call(b, "sum_reduce", [_call(b, "mul", [h, q], state)], row, axes=[axis])
    return h, _call(b, "squeeze", [out], (*state[:axis], state[-1]), axes=[axis])


def _scan(
    b: Builder,
    step: Callable[..., tuple[Value, Value]],
    xs: list[Value],
    h0: Value,
    y_shape: tuple[Dim, ...],
) -> tuple[Value, Value]:
    """``step`` over axis 1 of ``xs`` from ``h0``: the stacked read-outs and the last state."""
    batch = shape_of(xs[0])[0]
    state = (batch, 1, *shape_of(h0)[1:])
    h = _unsqueeze(b, b.tensor(h0), 1)
    if not b.tract:  # no loop op: unroll the static length
        ys = []
        for t in range(int(y_shape[1])):
            h, y = step(b, *(_slice(b, x, t) for x in xs), h)
            ys.append(y)
        y_all = ys[0] if len(ys) == 1 else b.call("concat", [ys], {"axis": 1}, dtype=h0.dtype, shape=y_shape)
        return y_all, _call(b, "squeeze", [h], shape_of(h0), axes=[1])
    params = [
        (f"x{i}", x.dtype or torch.float32, (shape_of(x)[0], 1, *shape_of(x)[2:])) for i, x in enumerate(xs)
    ]
    params.append(("h", h0.dtype or torch.float32, state))

    def body(sub: Builder, values: list[Value]) -> list[Value]:
        return list(step(sub, *values))

    frag = b.fragment("scan_step", params, body)
    attrs = {
        "body": frag.name,
        "scan": [(frag.params[i], x, 1, 1) for i, x in enumerate(xs)],
        "full": list(frag.captures),
        "state": [(frag.params[len(xs)], h, frag.results[0])],
        "output": [(frag.results[1], "full", 1, 1), (frag.results[0], "last", 1, 1)],
    }
    y_all, h_last = b.call_multi("tract_core_scan", [], attrs, 2)
    y_all = y_all.with_meta(h0.dtype, y_shape)
    h_last = h_last.with_meta(h0.dtype, state)
    return y_all, _call(b, "squeeze", [h_last], shape_of(h0), axes=[1])


@rule("torchlower::linear_scan")
def linear_scan(b: Builder, a: Value, u: Value, c: Value, h0: Value) -> tuple[Value, Value]:
    """linear_scan(Tensor a, Tensor u, Tensor c, Tensor h0) -> (Tensor, Tensor)"""
    xs = [_full_rank(b, v, h0.rank + 1) for v in (a, u, c)]
    y_shape = (shape_of(u)[0], shape_of(u)[1], *shape_of(h0)[1:-1])
    return _scan(b, _step, xs, h0, y_shape)


@rule("torchlower::delta_scan")
def delta_scan(
    b: Builder, decay: Value, beta: Value, q: Value, k: Value, v: Value, h0: Value
) -> tuple[Value, Value]:
    """delta_scan(Tensor decay, Tensor beta, Tensor q, Tensor k, Tensor v, Tensor h0) -> (Tensor, Tensor)"""
    xs = [b.tensor(x) for x in (decay, beta, q, k, v)]
    h = shape_of(h0)
    y_shape = (shape_of(v)[0], shape_of(v)[1], h[1], h[3])
    return _scan(b, _delta_step, xs, h0, y_shape)


def _full_rank(b: Builder, x: Value, rank: int) -> Value:
    """``x`` with the state's rank (leading axes kept, ones inserted after the time axis), as a
    graph tensor: the scan slices it along axis 1."""
    x = b.tensor(x)
    while x.rank < rank:
        x = _unsqueeze(b, x, 2)
    return x

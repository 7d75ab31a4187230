"""Recurrent layers (LSTM, GRU, Elman RNN) and their cells.

The input projection of a whole layer is one ``matmul`` over all time steps; each step then adds
the recurrent projection and applies the gates. For tract each layer direction is one
``tract_core_scan`` loop whose body fragment is that step: the length may be symbolic, and it
loads and runs faster than unrolled steps (2-layer LSTM(32, 64), B=1, S=4/16/64: run 0.08/0.42/
1.3 ms vs 0.17/0.55/2.3 ms, load 0.05 s vs 0.05/0.34/3.1 s). Khronos-only NNEF has no loop, so
there the static sequence is unrolled; a zero initial state (PyTorch's default) is then
recognised at export time and its products are skipped. ATen rules (jit), the export front end's
``torchlower::rnn`` and module rules (FX leaves, both in recurrent_modules.py) share the same step code.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from torchlower.core.values import Value, constant
from torchlower.errors import LoweringError
from torchlower.rules import rule
from torchlower.rules.common import Builder, shape_of, unsqueeze_to

_GATES = {"lstm": 4, "gru": 3, "rnn_tanh": 1, "rnn_relu": 1}


@dataclass(frozen=True)
class Cell:
    """One direction of one layer: its weights and what kind of recurrence it runs."""

    kind: str
    w_ih: Value
    w_hh: Value
    b_ih: Value | None = None
    b_hh: Value | None = None
    w_hr: Value | None = None  # LSTM projection (proj_size > 0)

    @property
    def hidden(self) -> int:
        return int(shape_of(self.w_hh)[0]) // _GATES[self.kind]


# ---- small emitters ---------------------------------------------------------------------------
def _matmul_t(b: Builder, x: Value, w: Value) -> Value:
    """``x @ wᵀ`` for a 2-D weight and any-rank ``x``."""
    shape = (*shape_of(x)[:-1], shape_of(w)[0])
    w = unsqueeze_to(b, w, x.rank)
    out = b.call("matmul", [x, w], {"transposeA": False, "transposeB": True}, dtype=x.dtype)
    return out.with_meta(x.dtype, shape)


def _binary(b: Builder, op: str, x: Value, y: Value) -> Value:
    if y.rank < x.rank:
        y = unsqueeze_to(b, y, x.rank)  # type: ignore[assignment]
    return b.call(op, [x, y], dtype=x.dtype, shape=x.shape)


def _add(b: Builder, x: Value, y: Value | None) -> Value:
    return x if y is None else _binary(b, "add", x, y)


def _unary(b: Builder, op: str, x: Value) -> Value:
    return b.call(op, [x], dtype=x.dtype, shape=x.shape)


def _part(b: Builder, x: Value, k: int, size: int) -> Value:
    """Gate ``k`` (width ``size``) of the last axis."""
    if x.is_const:
        return constant(x.const[..., k * size : (k + 1) * size])
    shape = (*shape_of(x)[:-1], size)
    attrs = {"axes": [x.rank - 1], "begin": [k * size], "end": [(k + 1) * size]}
    return b.call("slice", [x], attrs, dtype=x.dtype, shape=shape)


def _step_of(b: Builder, x: Value, t: int) -> Value:
    """Time step ``t`` of a (T, B, F) tensor, kept 3-D as (1, B, F)."""
    shape = (1, *shape_of(x)[1:])
    return b.call("slice", [x], {"axes": [0], "begin": [t], "end": [t + 1]}, dtype=x.dtype, shape=shape)


def _concat(b: Builder, parts: Sequence[Value], axis: int) -> Value:
    if len(parts) == 1:
        return parts[0]
    shape = list(shape_of(parts[0]))
    shape[axis] = sum(int(shape_of(p)[axis]) for p in parts)
    return b.call("concat", [list(parts)], {"axis": axis}, dtype=parts[0].dtype, shape=tuple(shape))


def _transpose01(b: Builder, x: Value) -> Value:
    s = shape_of(x)
    return b.call("transpose", [x], {"axes": [1, 0, 2]}, dtype=x.dtype, shape=(s[1], s[0], s[2]))


# ---- one step -----------------------------------------------------------------------------------
def step(b: Builder, cell: Cell, gi: Value, h: Value | None, c: Value | None) -> tuple[Value, Value | None]:
    """One recurrence step from the input gates ``gi`` (input projection + b_ih, plus b_hh for
    LSTM / RNN); ``None`` states are zeros. Returns the new (h, c)."""
    size = cell.hidden
    if cell.kind == "gru":
        return _gru_step(b, cell, gi, h, size), None
    gates = gi if h is None else _add(b, gi, _matmul_t(b, h, cell.w_hh))
    if cell.kind == "rnn_tanh":
        return _unary(b, "tanh", gates), None
    if cell.kind == "rnn_relu":
        return _unary(b, "relu", gates), None
    i, f, g, o = (_part(b, gates, k, size) for k in range(4))
    i, f, o = (_unary(b, "sigmoid", v) for v in (i, f, o))
    c_new = _binary(b, "mul", i, _unary(b, "tanh", g))
    if c is not None:
        c_new = _binary(b, "add", _binary(b, "mul", f, c), c_new)
    h_new = _binary(b, "mul", o, _unary(b, "tanh", c_new))
    if cell.w_hr is not None:
        h_new = _matmul_t(b, h_new, cell.w_hr)
    return h_new, c_new


def _gru_step(b: Builder, cell: Cell, gi: Value, h: Value | None, size: int) -> Value:
    """r, z = σ(gi + gh); n = tanh(gi_n + r·gh_n); h' = n + z·(h − n), with gh = h W_hhᵀ + b_hh."""
    gh = cell.b_hh if h is None else _add(b, _matmul_t(b, h, cell.w_hh), cell.b_hh)
    parts_i = [_part(b, gi, k, size) for k in range(3)]
    parts_h = [_part(b, gh, k, size) for k in range(3)] if gh is not None else [None] * 3
    r, z = (_unary(b, "sigmoid", _add(b, parts_i[k], parts_h[k])) for k in range(2))
    hn = parts_h[2]
    n = _unary(b, "tanh", parts_i[2] if hn is None else _add(b, parts_i[2], _binary(b, "mul", r, hn)))
    if h is None:  # h' = (1 - z)·n
        return _binary(b, "sub", n, _binary(b, "mul", z, n))
    return _binary(b, "add", n, _binary(b, "mul", z, _binary(b, "sub", h, n)))


def input_gates(b: Builder, cell: Cell, x: Value) -> Value:
    """``x W_ihᵀ + b_ih`` (+ ``b_hh`` where it is not gated by r, i.e. all but GRU)."""
    bias = cell.b_ih
    if cell.kind != "gru" and cell.b_hh is not None:
        bias = cell.b_hh if bias is None else _sum_bias(b, bias, cell.b_hh)
    return _add(b, _matmul_t(b, x, cell.w_ih), bias)


def _sum_bias(b: Builder, x: Value, y: Value) -> Value:
    if x.is_const and y.is_const:
        return constant(x.const + y.const)
    return b.call("add", [x, y], dtype=x.dtype, shape=x.shape)


# ---- whole layers -----------------------------------------------------------------------------
def _state(b: Builder, hx: Value | None, index: int) -> Value | None:
    """Initial state ``index`` (1, B, H) of a stacked (L·D, B, H) state; zeros become None."""
    if hx is None:
        return None
    if hx.is_const:
        part = hx.const[index : index + 1]
        return None if not bool(part.any()) else constant(part)
    return _step_of(b, hx, index)


def run(
    b: Builder,
    cells: Sequence[Cell],
    x: Value,
    h0: Value | None,
    c0: Value | None,
    num_layers: int,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[Value, Value, Value | None]:
    """A stacked recurrence over (T, B, I) (or (B, T, I)): returns output, h_n and c_n."""
    dirs = 2 if bidirectional else 1
    if len(cells) != num_layers * dirs:
        raise LoweringError(f"expected {num_layers * dirs} weight sets, got {len(cells)}")
    seq = _transpose01(b, x) if batch_first else x
    length = shape_of(seq)[0]
    if not b.tract and not isinstance(length, int):
        raise LoweringError(
            f"recurrent layers are unrolled in Khronos-only NNEF (no loop op): the sequence length"
            f" ({length}) must be static; drop it from dynamic_axes or export for tract"
        )
    finals_h: list[Value] = []
    finals_c: list[Value] = []
    for layer in range(num_layers):
        outs = []
        for d in range(dirs):
            index = layer * dirs + d
            cell = cells[index]
            gates = input_gates(b, cell, seq)
            h, c = _state(b, h0, index), _state(b, c0, index)
            if b.tract:  # a loop: any length, and faster to load and run than unrolled steps
                y, h, c = scan(b, cell, gates, h, c, reverse=bool(d))
                outs.append(y)
                finals_h.append(h)
                if c is not None:
                    finals_c.append(c)
                continue
            steps: list[Value] = [seq] * length
            for t in reversed(range(length)) if d else range(length):
                h, c = step(b, cell, _step_of(b, gates, t), h, c)
                steps[t] = h
            outs.append(_concat(b, steps, 0))
            finals_h.append(h)  # type: ignore[arg-type]
            if c is not None:
                finals_c.append(c)
        seq = _concat(b, outs, 2)
    y = _transpose01(b, seq) if batch_first else seq
    return y, _concat(b, finals_h, 0), _concat(b, finals_c, 0) if finals_c else None


def _zeros(b: Builder, like: Value, size: int) -> Value:
    """A zero state (1, B, size) for the batch of ``like`` (T, B, ·), symbolic B included."""
    batch = shape_of(like)[1]
    if isinstance(batch, int):
        return constant(torch.zeros(1, batch, size))
    shape = [1, batch, size]
    return b.call(
        "tract_core_broadcast",
        [constant(torch.zeros(1, 1, size))],
        {"shape": shape},
        dtype=torch.float32,
        shape=tuple(shape),
    )


def scan(
    b: Builder, cell: Cell, gates: Value, h: Value | None, c: Value | None, reverse: bool
) -> tuple[Value, Value, Value | None]:
    """One direction over a symbolic length as ``tract_core_scan``: the loop body is ``step``
    on one (1, B, ·) slice of the input gates, with h (and c) as states and the weights as full
    inputs. Returns the output sequence and the final h (and c)."""
    size = cell.hidden
    h_size = size if cell.w_hr is None else int(shape_of(cell.w_hr)[0])
    h = h if h is not None else _zeros(b, gates, h_size)
    lstm = cell.kind == "lstm"
    if lstm:
        c = c if c is not None else _zeros(b, gates, size)
    h, c = b.tensor(h), None if c is None else b.tensor(c)  # attributes are not materialised by call
    g_shape = (1, *shape_of(gates)[1:])
    params = [("g", gates.dtype, g_shape), ("h", torch.float32, (1, shape_of(gates)[1], h_size))]
    if lstm:
        params.append(("c", torch.float32, (1, shape_of(gates)[1], size)))

    def body(sub: Builder, values: list[Value]) -> list[Value]:
        h_new, c_new = step(sub, cell, values[0], values[1], values[2] if lstm else None)
        return [h_new, c_new] if lstm else [h_new]  # type: ignore[list-item]

    frag = b.fragment("scan_body", params, body)
    chunk = -1 if reverse else 1
    states = [(frag.params[1], h, frag.results[0])]
    outputs = [(frag.results[0], "full", 0, chunk), (frag.results[0], "last", 0, 1)]
    if lstm:
        states.append((frag.params[2], c, frag.results[1]))
        outputs.append((frag.results[1], "last", 0, 1))
    attrs = {
        "body": frag.name,
        "scan": [(frag.params[0], gates, 0, chunk)],
        "full": list(frag.captures),
        "state": states,
        "output": outputs,
    }
    outs = b.call_multi("tract_core_scan", [], attrs, len(outputs))
    y = outs[0].with_meta(gates.dtype, (shape_of(gates)[0], shape_of(gates)[1], h_size))
    h_n = outs[1].with_meta(gates.dtype, (1, shape_of(gates)[1], h_size))
    c_n = outs[2].with_meta(gates.dtype, (1, shape_of(gates)[1], size)) if lstm else None
    return y, h_n, c_n


def cells_from_params(kind: str, params: Sequence[Value], has_biases: bool, count: int) -> list[Cell]:
    """Split ATen's flat weight list: per layer and direction w_ih, w_hh[, b_ih, b_hh][, w_hr]."""
    per = len(params) // count
    if per * count != len(params) or per not in ((4, 5) if has_biases else (2, 3)):
        raise LoweringError(f"{kind}: cannot split {len(params)} weights into {count} layer/directions")
    cells = []
    for i in range(count):
        group = list(params[i * per : (i + 1) * per])
        w_ih, w_hh = group[:2]
        b_ih, b_hh = group[2:4] if has_biases else (None, None)
        w_hr = group[-1] if per in (3, 5) else None
        cells.append(Cell(kind, w_ih, w_hh, b_ih, b_hh, w_hr))
    return cells


def check_inference(kind: str, dropout: float, train: bool) -> None:
    if train and dropout:
        raise LoweringError(f"{kind}: train=True with dropout={dropout} is random; export in eval mode")


@rule("aten::lstm.input")
def lstm(
    b: Builder,
    x: Value,
    hx: Sequence[Value],
    params: Sequence[Value],
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[Value, Value, Value]:
    """lstm.input(Tensor input, Tensor[] hx, Tensor[] params, bool has_biases, int num_layers,
    float dropout, bool train, bool bidirectional, bool batch_first) -> (Tensor, Tensor, Tensor)"""
    check_inference("lstm", dropout, train)
    cells = cells_from_params("lstm", params, has_biases, num_layers * (2 if bidirectional else 1))
    y, h, c = run(b, cells, x, hx[0], hx[1], num_layers, bidirectional, batch_first)
    return y, h, c if c is not None else h


def _rnn(kind: str) -> Callable[..., tuple[Value, Value]]:
    """The gru / rnn_tanh / rnn_relu rules share one signature."""

    def lower(
        b: Builder,
        x: Value,
        hx: Value,
        params: Sequence[Value],
        has_biases: bool,
        num_layers: int,
        dropout: float,
        train: bool,
        bidirectional: bool,
        batch_first: bool,
    ) -> tuple[Value, Value]:
        check_inference(kind, dropout, train)
        cells = cells_from_params(kind, params, has_biases, num_layers * (2 if bidirectional else 1))
        y, h, _ = run(b, cells, x, hx, None, num_layers, bidirectional, batch_first)
        return y, h

    lower.__doc__ = (
        f"{kind}.input(Tensor input, Tensor hx, Tensor[] params, bool has_biases, int num_layers, "
        "float dropout, bool train, bool bidirectional, bool batch_first) -> (Tensor, Tensor)"
    )
    lower.__name__ = lower.__qualname__ = kind
    return rule(f"aten::{kind}.input")(lower)


gru = _rnn("gru")
rnn_tanh = _rnn("rnn_tanh")
rnn_relu = _rnn("rnn_relu")


# ---- cells --------------------------------------------------------------------------------------
def run_cell(
    b: Builder, cell: Cell, x: Value, h: Value | None, c: Value | None
) -> tuple[Value, Value | None]:
    return step(b, cell, input_gates(b, cell, x), _nonzero(h), _nonzero(c))


def _nonzero(v: Value | None) -> Value | None:
    return None if v is None or (v.is_const and not bool(v.const.any())) else v


@rule("aten::lstm_cell")
def lstm_cell(
    b: Builder,
    x: Value,
    hx: Sequence[Value],
    w_ih: Value,
    w_hh: Value,
    b_ih: Value | None,
    b_hh: Value | None,
) -> tuple[Value, Value]:
    """lstm_cell(Tensor input, Tensor[] hx, Tensor w_ih, Tensor w_hh, Tensor? b_ih=None,
    Tensor? b_hh=None) -> (Tensor, Tensor)"""
    h, c = run_cell(b, Cell("lstm", w_ih, w_hh, b_ih, b_hh), x, hx[0], hx[1])
    return h, c  # type: ignore[return-value]


def _cell_rule(kind: str) -> Callable[..., Value]:
    def lower(
        b: Builder, x: Value, hx: Value, w_ih: Value, w_hh: Value, b_ih: Value | None, b_hh: Value | None
    ) -> Value:
        return run_cell(b, Cell(kind, w_ih, w_hh, b_ih, b_hh), x, hx, None)[0]

    lower.__doc__ = (
        f"{kind}_cell(Tensor input, Tensor hx, Tensor w_ih, Tensor w_hh, Tensor? b_ih=None, "
        "Tensor? b_hh=None) -> Tensor"
    )
    lower.__name__ = lower.__qualname__ = f"{kind}_cell"
    return rule(f"aten::{kind}_cell")(lower)


gru_cell = _cell_rule("gru")
rnn_tanh_cell = _cell_rule("rnn_tanh")
rnn_relu_cell = _cell_rule("rnn_relu")

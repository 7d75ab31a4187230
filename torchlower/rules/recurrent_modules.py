"""Recurrent layers entered as whole modules: FX leaves, and torch.export with dynamic shapes.

Module rules lower nn.LSTM / nn.GRU / nn.RNN (and their cells) when the FX front end keeps them
as leaves. For ``torch.export``: ATen's ``lstm`` / ``gru`` / ``rnn_*`` are composite ops whose
traced decomposition unrolls over the time steps and so fixes the sequence length
("specialized it to be a constant"). While exporting with dynamic shapes, ``recurrent_as_one_op``
routes ``nn.LSTM`` / ``nn.GRU`` / ``nn.RNN`` (their ``_VF`` calls) through the opaque custom op
``torchlower::rnn``, whose fake kernel gives symbolic output shapes; its rule lowers it like ``aten::lstm``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import _VF, Tensor, nn

from torchlower.core.values import Dim, Value, constant
from torchlower.rules import module_rule, rule
from torchlower.rules.common import Builder, shape_of
from torchlower.rules.recurrent import Cell, cells_from_params, check_inference, run, run_cell

_KINDS = ("lstm", "gru", "rnn_tanh", "rnn_relu")


@torch.library.custom_op("torchlower::rnn", mutates_args=())
def rnn_op(
    x: Tensor,
    hx: list[Tensor],
    params: list[Tensor],
    kind: str,
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
) -> list[Tensor]:
    """Eager: the ATen op itself. Returns [output, h_n] (+ [c_n] for LSTM)."""
    flags = (has_biases, num_layers, dropout, train, bidirectional, batch_first)
    if kind == "lstm":
        return list(torch.lstm(x, hx, params, *flags))
    return list(getattr(torch, kind)(x, hx[0], params, *flags))


@rnn_op.register_fake
def _(
    x: Tensor,
    hx: list[Tensor],
    params: list[Tensor],
    kind: str,
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
) -> list[Tensor]:
    dirs = 2 if bidirectional else 1
    length, batch = (x.shape[1], x.shape[0]) if batch_first else (x.shape[0], x.shape[1])
    h_size = params[1].shape[1]  # w_hh is (gates·hidden, proj or hidden)
    y_shape = (batch, length, dirs * h_size) if batch_first else (length, batch, dirs * h_size)
    outs = [x.new_empty(y_shape), x.new_empty((num_layers * dirs, batch, h_size))]
    if kind == "lstm":
        outs.append(x.new_empty((num_layers * dirs, batch, params[1].shape[0] // 4)))
    return outs


@rule("torchlower::rnn")
def rnn(
    b: Builder,
    x: Value,
    hx: Sequence[Value],
    params: Sequence[Value],
    kind: str,
    has_biases: bool,
    num_layers: int,
    dropout: float,
    train: bool,
    bidirectional: bool,
    batch_first: bool,
) -> tuple[Value, ...]:
    """rnn(Tensor x, Tensor[] hx, Tensor[] params, str kind, bool has_biases, int num_layers,
    float dropout, bool train, bool bidirectional, bool batch_first) -> Tensor[]"""
    check_inference(kind, dropout, train)
    cells = cells_from_params(kind, params, has_biases, num_layers * (2 if bidirectional else 1))
    c0 = hx[1] if kind == "lstm" else None
    y, h, c = run(b, cells, x, hx[0], c0, num_layers, bidirectional, batch_first)
    return (y, h) if c is None else (y, h, c)


def _routed(kind: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def call(x: Tensor, hx: Any, *rest: Any) -> Any:
        if len(rest) != 7:  # packed sequences (data, batch_sizes, ...) keep the ATen op
            return original(x, hx, *rest)
        states = list(hx) if isinstance(hx, (list, tuple)) else [hx]
        return tuple(rnn_op(x, states, list(rest[0]), kind, *rest[1:]))

    return call


@contextlib.contextmanager
def recurrent_as_one_op() -> Iterator[None]:
    """Within: nn.LSTM / nn.GRU / nn.RNN call ``torchlower::rnn`` instead of their ATen op."""
    saved = {kind: _VF.__dict__.get(kind) for kind in _KINDS}
    try:
        for kind in _KINDS:
            setattr(_VF, kind, _routed(kind, getattr(torch, kind)))
        yield
    finally:
        for kind, previous in saved.items():
            if previous is None:
                delattr(_VF, kind)
            else:
                setattr(_VF, kind, previous)


# ---- module rules (FX leaves) -----------------------------------------------------------------
def _kind(m: nn.Module) -> str:
    if isinstance(m, (nn.LSTM, nn.LSTMCell)):
        return "lstm"
    if isinstance(m, (nn.GRU, nn.GRUCell)):
        return "gru"
    return "rnn_relu" if getattr(m, "nonlinearity", "tanh") == "relu" else "rnn_tanh"


def _param(m: nn.Module, name: str) -> Value | None:
    p = getattr(m, name, None)
    return None if p is None else constant(p.detach(), label=name)


def _batched(b: Builder, x: Value, rank: int, axis: int) -> Value:
    if x.rank == rank:
        return x
    shape = list(shape_of(x))
    shape.insert(axis, 1)
    return b.call("unsqueeze", [x], {"axes": [axis]}, dtype=x.dtype, shape=tuple(shape))


def _unbatched(b: Builder, x: Value, axis: int) -> Value:
    shape: tuple[Dim, ...] = tuple(d for i, d in enumerate(shape_of(x)) if i != axis)
    return b.call("squeeze", [x], {"axes": [axis]}, dtype=x.dtype, shape=shape)


@module_rule(nn.LSTM, nn.GRU, nn.RNN)
def recurrent_module(
    b: Builder, m: nn.RNNBase, x: Value, hx: Value | Sequence[Value] | None = None
) -> tuple[Value, object]:
    """nn.LSTM / nn.GRU / nn.RNN forward: returns (output, h_n) or (output, (h_n, c_n))."""
    kind = _kind(m)
    batched = x.rank == 3
    x = _batched(b, x, 3, 0 if m.batch_first else 1)
    states = list(hx) if isinstance(hx, (list, tuple)) else [hx, None]
    if not batched:
        states = [None if s is None else _batched(b, s, 3, 1) for s in states]
    names = m._flat_weights_names
    params = [constant(w.detach(), label=n) for w, n in zip(m._flat_weights, names, strict=True)]
    dirs = 2 if m.bidirectional else 1
    cells = cells_from_params(kind, params, m.bias, m.num_layers * dirs)
    y, h, c = run(b, cells, x, states[0], states[1], m.num_layers, m.bidirectional, m.batch_first)
    if not batched:
        y, h = _unbatched(b, y, 0 if m.batch_first else 1), _unbatched(b, h, 1)
        c = None if c is None else _unbatched(b, c, 1)
    return (y, (h, c)) if kind == "lstm" else (y, h)


@module_rule(nn.LSTMCell, nn.GRUCell, nn.RNNCell)
def cell_module(b: Builder, m: nn.RNNCellBase, x: Value, hx: Value | Sequence[Value] | None = None) -> object:
    """nn.LSTMCell / nn.GRUCell / nn.RNNCell forward (1-D inputs are unbatched)."""
    cell = Cell(_kind(m), *(_param(m, n) for n in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")))  # type: ignore[arg-type]
    batched = x.rank == 2
    states = list(hx) if isinstance(hx, (list, tuple)) else [hx, None]
    if not batched:
        x = _batched(b, x, 2, 0)
        states = [None if s is None else _batched(b, s, 2, 0) for s in states]
    h, c = run_cell(b, cell, x, states[0], states[1])
    if not batched:
        h = _unbatched(b, h, 0)
        c = None if c is None else _unbatched(b, c, 0)
    return (h, c) if cell.kind == "lstm" else h

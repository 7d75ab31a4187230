"""Recurrent layers through ``torch.export`` with a dynamic sequence axis.

ATen's ``lstm`` / ``gru`` / ``rnn_*`` are composite ops: torch.export traces their decomposition,
which unrolls over the time steps and so fixes the sequence length ("specialized it to be a
constant"). While exporting with dynamic shapes, ``recurrent_as_one_op`` routes ``nn.LSTM`` /
``nn.GRU`` / ``nn.RNN`` (their ``_VF`` calls) through the opaque custom op ``torchlower::rnn``,
whose fake kernel gives symbolic output shapes; its rule lowers it like ``aten::lstm``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import _VF, Tensor

from torchlower.rules import rule
from torchlower.rules.common import Builder
from torchlower.rules.recurrent import cells_from_params, check_inference, run
from torchlower.values import Value

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

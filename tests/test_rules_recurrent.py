from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.conftest import export_and_check
from torchlower.nnef import archive
from torchlower.nnef.builder import NNEFBuilder
from torchlower.pipeline.export import verify
from torchlower.rules import NNEF_RULES, coverage
from torchlower.rules.registry import describe


def check_module_rule(tmp_path: Path, module: nn.Module, args: Sequence[object]) -> None:
    """Lower ``module`` with its module rule (as the FX front end does), run in tract, compare.

    ``args`` are the module's forward arguments (tensors, tuples of tensors, None, Python values);
    tensors become graph inputs and reach the rule as Values in the same structure.
    """
    module.eval()
    leaves, spec = torch.utils._pytree.tree_flatten(list(args))
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    with torch.no_grad():
        expected = [t for t in torch.utils._pytree.tree_leaves(module(*args)) if t is not None]
    b = NNEFBuilder()
    values = iter([b.add_input(f"in{i}", t.dtype, tuple(t.shape)) for i, t in enumerate(tensors)])
    swapped = [next(values) if isinstance(t, torch.Tensor) else t for t in leaves]
    rule = NNEF_RULES.lookup_module(type(module))
    assert rule is not None
    lowered = rule.fn(b, module, *torch.utils._pytree.tree_unflatten(swapped, spec))
    outs = [v for v in torch.utils._pytree.tree_leaves(lowered) if v is not None]
    names = [f"out{i}" for i in range(len(outs))]
    b.set_outputs(names, outs)
    path = archive.write(tmp_path / "m.nnef.tgz", b.graph_text(), b.live_weights())
    errors = verify(path, tensors, expected, names)
    assert len(errors) == len(expected) and all(e.ok for e in errors)
    coverage.verified([describe(rule.key)])


def check_function_rule(
    tmp_path: Path,
    key: str,
    build: Callable[..., list],
    inputs: Sequence[torch.Tensor],
    expected: Sequence[torch.Tensor],
) -> None:
    """Call the ATen rule ``key`` directly on graph inputs (as every front end does), run in tract."""
    b = NNEFBuilder()
    vals = [b.add_input(f"in{i}", t.dtype, tuple(t.shape)) for i, t in enumerate(inputs)]
    rule = NNEF_RULES.lookup_function(key)
    assert rule is not None
    outs = torch.utils._pytree.tree_leaves(rule.fn(b, *build(*vals)))
    names = [f"out{i}" for i in range(len(outs))]
    b.set_outputs(names, outs)
    path = archive.write(tmp_path / "m.nnef.tgz", b.graph_text(), b.live_weights())
    errors = verify(path, list(inputs), list(expected), names)
    assert errors and all(e.ok for e in errors)
    coverage.verified([describe(rule.key)])


class WithStates(nn.Module):
    """Feeds initial states (if any) through as graph inputs and returns every output."""

    def __init__(self, rnn: nn.RNNBase, given: bool) -> None:
        super().__init__()
        self.rnn, self.given, self.lstm = rnn, given, isinstance(rnn, nn.LSTM)

    def forward(self, x, h=None, c=None):
        if self.lstm:
            y, (h_n, c_n) = self.rnn(x, (h, c)) if self.given else self.rnn(x)
            return y, h_n, c_n
        y, h_n = self.rnn(x, h) if self.given else self.rnn(x)
        return y, h_n


def make(cls: type, layers: int, bidirectional: bool, batch_first: bool, **kwargs) -> nn.RNNBase:
    return cls(4, 5, num_layers=layers, bidirectional=bidirectional, batch_first=batch_first, **kwargs)


def states_for(rnn: nn.RNNBase, batch: int) -> list[torch.Tensor]:
    dirs = 2 if rnn.bidirectional else 1
    h_size = rnn.proj_size if getattr(rnn, "proj_size", 0) else rnn.hidden_size
    h = torch.randn(rnn.num_layers * dirs, batch, h_size)
    if isinstance(rnn, nn.LSTM):
        return [h, torch.randn(rnn.num_layers * dirs, batch, rnn.hidden_size)]
    return [h]


VARIANTS = [(1, False, False), (2, False, True), (1, True, False), (2, True, True)]
KINDS = [nn.LSTM, nn.GRU, nn.RNN, lambda *a, **k: nn.RNN(*a, nonlinearity="relu", **k)]


@pytest.mark.parametrize("cls", KINDS, ids=["lstm", "gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize(("layers", "bidirectional", "batch_first"), VARIANTS)
def test_recurrent_given_states(tmp_path, frontend, cls, layers, bidirectional, batch_first):
    rnn = make(cls, layers, bidirectional, batch_first)
    x = torch.randn(2, 6, 4) if batch_first else torch.randn(6, 2, 4)
    export_and_check(WithStates(rnn, True), (x, *states_for(rnn, 2)), tmp_path, frontend)


@pytest.mark.parametrize("cls", KINDS, ids=["lstm", "gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize(("layers", "bidirectional", "batch_first"), VARIANTS)
def test_recurrent_zero_states(tmp_path, frontend, cls, layers, bidirectional, batch_first):
    rnn = make(cls, layers, bidirectional, batch_first)
    x = torch.randn(3, 5, 4) if batch_first else torch.randn(5, 3, 4)
    export_and_check(WithStates(rnn, False), x, tmp_path, frontend)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_lstm_projection_no_bias(tmp_path, frontend, bidirectional):
    rnn = nn.LSTM(4, 6, num_layers=2, bias=False, proj_size=3, bidirectional=bidirectional)
    x = torch.randn(4, 2, 4)
    export_and_check(WithStates(rnn, True), (x, *states_for(rnn, 2)), tmp_path, frontend)


# ---- module rules (what the FX front end calls for leaf modules) -------------------------------
@pytest.mark.parametrize("cls", KINDS, ids=["lstm", "gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize(("layers", "bidirectional", "batch_first"), VARIANTS)
@pytest.mark.parametrize("given", [False, True])
def test_recurrent_module_rule(tmp_path, cls, layers, bidirectional, batch_first, given):
    rnn = make(cls, layers, bidirectional, batch_first)
    x = torch.randn(2, 5, 4) if batch_first else torch.randn(5, 2, 4)
    states = states_for(rnn, 2) if given else [None]
    check_module_rule(tmp_path, rnn, [x, tuple(states) if len(states) == 2 else states[0]])


@pytest.mark.parametrize("cls", [nn.LSTM, nn.GRU], ids=["lstm", "gru"])
def test_recurrent_module_rule_unbatched(tmp_path, cls):
    rnn = cls(4, 5, num_layers=2, bidirectional=True)
    states = [s[:, 0] for s in states_for(rnn, 1)]
    check_module_rule(tmp_path, rnn, [torch.randn(6, 4), tuple(states) if len(states) == 2 else states[0]])


@pytest.mark.parametrize("cls", [nn.LSTMCell, nn.GRUCell, nn.RNNCell], ids=["lstm", "gru", "rnn"])
@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("batched", [False, True])
def test_cell_module_rule(tmp_path, cls, given, batched):
    cell = cls(4, 5)
    lead = (3,) if batched else ()
    states = [torch.randn(*lead, 5) for _ in range(2 if cls is nn.LSTMCell else 1)] if given else [None]
    check_module_rule(
        tmp_path, cell, [torch.randn(*lead, 4), tuple(states) if len(states) == 2 else states[0]]
    )


# ---- ATen cell rules (torch.jit.trace decomposes cells; torch.export / FX may keep them) --------
@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
@pytest.mark.parametrize("bias", [False, True])
def test_aten_cell_rules(tmp_path, kind, bias):
    gates = {"lstm": 4, "gru": 3}.get(kind, 1)
    x, h, c = torch.randn(3, 4), torch.randn(3, 5), torch.randn(3, 5)
    w_ih, w_hh = torch.randn(gates * 5, 4), torch.randn(gates * 5, 5)
    b_ih, b_hh = (torch.randn(gates * 5), torch.randn(gates * 5)) if bias else (None, None)
    fn = getattr(torch, f"{kind}_cell")
    from torchlower.core.values import constant

    w = [constant(t) if t is not None else None for t in (w_ih, w_hh, b_ih, b_hh)]
    if kind == "lstm":
        expected = fn(x, (h, c), w_ih, w_hh, b_ih, b_hh)
        check_function_rule(
            tmp_path, "aten::lstm_cell", lambda *v: [v[0], list(v[1:]), *w], [x, h, c], expected
        )
    else:
        expected = [fn(x, h, w_ih, w_hh, b_ih, b_hh)]
        check_function_rule(tmp_path, f"aten::{kind}_cell", lambda *v: [*v, *w], [x, h], expected)

"""Recurrent layers with a dynamic sequence (and batch) axis: lowered to tract's scan loop, exported
once, run in tract at several sizes (including 1) and compared with PyTorch at each size."""

from __future__ import annotations

import tarfile

import numpy as np
import pytest
import torch
from torch import nn

import torchlower
from tests.test_dynamic import export_dynamic
from torchlower.errors import InvalidArgumentError, LoweringError
from torchlower.nnef.tract import run_in_tract


class Seq(nn.Module):
    """Returns every output of the recurrent layer (output sequence and final states)."""

    def __init__(self, rnn: nn.RNNBase) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y, state = self.rnn(x)
        return (y, *state) if isinstance(state, tuple) else (y, state)


class WithState(nn.Module):
    """An LSTM fed an initial state (h0, c0) that is an input too."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(5, 6, num_layers=2, batch_first=True)

    def forward(self, x: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y, (h, c) = self.rnn(x, (h0, c0))
        return y, h, c


LSTMS = {
    "lstm_batch_first": dict(batch_first=True),
    "lstm_seq_first": dict(batch_first=False),
    "lstm_2_layers": dict(num_layers=2, batch_first=True),
    "lstm_bidirectional_2_layers": dict(num_layers=2, bidirectional=True),
    "lstm_proj": dict(proj_size=3, batch_first=True),
}


@pytest.fixture(params=("jit", "fx", "export"))
def dyn_frontend(request: pytest.FixtureRequest) -> str:
    return request.param


def _axes(batch_first: bool, batch: bool) -> dict[str, dict[int, str]]:
    seq = {1 if batch_first else 0: "S"}
    return {"x": {**seq, 0 if batch_first else 1: "B"} if batch else seq}


@pytest.mark.parametrize("name", sorted(LSTMS))
def test_lstm_variable_sequence(tmp_path, dyn_frontend, name):
    torch.manual_seed(0)
    kwargs = LSTMS[name]
    model = Seq(nn.LSTM(5, 6, **kwargs))
    first = kwargs.get("batch_first", False)
    x = torch.randn(2, 7, 5) if first else torch.randn(7, 2, 5)
    errors = export_dynamic(model, (x,), tmp_path, dyn_frontend, _axes(first, batch=False))
    assert set(errors) == {(1,), (4,), (9,)}


@pytest.mark.parametrize("kind", ["lstm", "gru", "rnn_tanh", "rnn_relu"])
def test_variable_batch_and_sequence(tmp_path, dyn_frontend, kind):
    torch.manual_seed(0)
    layers = {
        "lstm": lambda: nn.LSTM(5, 6, num_layers=2, bidirectional=True, batch_first=True),
        "gru": lambda: nn.GRU(5, 6, num_layers=2, bidirectional=True, batch_first=True),
        "rnn_tanh": lambda: nn.RNN(5, 6, bidirectional=True, batch_first=True),
        "rnn_relu": lambda: nn.RNN(5, 6, nonlinearity="relu", batch_first=True),
    }
    errors = export_dynamic(
        Seq(layers[kind]()), (torch.randn(2, 7, 5),), tmp_path, dyn_frontend, _axes(True, batch=True)
    )
    assert len(errors) == 9  # B in (1, 3, 5) × S in (1, 4, 9)


def test_initial_state_inputs(tmp_path, dyn_frontend):
    torch.manual_seed(0)
    args = (torch.randn(2, 7, 5), torch.randn(2, 2, 6), torch.randn(2, 2, 6))
    axes = {"x": {0: "B", 1: "S"}, "h0": {1: "B"}, "c0": {1: "B"}}
    export_dynamic(WithState(), args, tmp_path, dyn_frontend, axes)


def _graph(path: object) -> str:
    with tarfile.open(path) as archive:
        return archive.extractfile("graph.nnef").read().decode()


def test_one_scan_per_layer_and_direction_at_any_length(tmp_path):
    """Static or symbolic, the length is a loop: the graph does not grow with the sequence."""
    model = Seq(nn.GRU(5, 6, num_layers=2, bidirectional=True)).eval()
    graphs = [
        _graph(torchlower.export(model, (torch.randn(n, 2, 5),), tmp_path / f"s{n}.nnef.tgz").path)
        for n in (3, 40)
    ]
    dynamic = torchlower.export(
        model, (torch.randn(3, 2, 5),), tmp_path / "d.nnef.tgz", dynamic_axes={"x": {0: "S"}}
    )
    graphs.append(_graph(dynamic.path))
    for graph in graphs:
        assert graph.count("tract_core_scan(") == 4
        assert graph.count("fragment ") == 4
    assert graphs[0].replace("[3, 2, 5]", "[40, 2, 5]") == graphs[1]


def test_f16_scan(tmp_path):
    torch.manual_seed(0)
    model = Seq(nn.LSTM(5, 6, batch_first=True)).eval()
    report = torchlower.export(
        model, (torch.randn(2, 7, 5),), tmp_path / "m.nnef.tgz", precision="f16", dynamic_axes={"x": {1: "S"}}
    )
    for n in (1, 4, 9):
        x = torch.randn(2, n, 5)
        got = run_in_tract(report.path, [x.numpy()])
        with torch.no_grad():
            want = model(x)
        assert max(float(np.abs(g - w.numpy()).max()) for g, w in zip(got, want, strict=True)) < 1e-2


class PinsLength(nn.Module):
    """Branches on the sequence length in Python: no artifact can keep it dynamic."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.LSTM(5, 6, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.rnn(x)[0]
        return y[:, -1] if x.shape[1] > 3 else y[:, 0]


def test_pinned_length_names_input_and_axis(tmp_path):
    with pytest.raises(LoweringError, match=r"input 'x' axis 1 \(S\) cannot be dynamic"):
        torchlower.export(
            PinsLength(), torch.randn(2, 7, 5), tmp_path / "m.nnef.tgz", frontend="jit",
            dynamic_axes={"x": {1: "S"}},
        )  # fmt: skip


def test_pinned_length_under_export_adopts_the_branchs_bound(tmp_path):
    """torch.export keeps the branch taken (``S > 3``) as a bound: adopted, said, and enforced."""
    report = torchlower.export(
        PinsLength(), torch.randn(2, 7, 5), tmp_path / "m.nnef.tgz", frontend="export",
        dynamic_axes={"x": {1: "S"}},
    )  # fmt: skip
    assert any("4 <= S adopted" in n and "PyTorch also runs at S=3" in n for n in report.notes), report.notes
    with pytest.raises(InvalidArgumentError, match="S = 3 is outside the archive's bound S >= 4"):
        torchlower.load(report.path).run([torch.randn(2, 3, 5).numpy()])

"""Streaming (issue 29): export(stream=), load().stream(), and the CLI, run in tract's real pulse
transform. Each zoo model is verified at one pulse by export (three input lengths) and again at a
second pulse through the API; every check compares with PyTorch on the streamed signal."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlower
from torchlower.artifact.stream_verify import verify_stream
from torchlower.errors import CheckError, InvalidArgumentError, InvalidPulseError, StreamingError

ROOT = Path(__file__).resolve().parents[1]


class CausalTCN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.c2 = nn.Conv1d(4, 8, 3), nn.Conv1d(8, 8, 3, dilation=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.c1(F.pad(x, (2, 0))))
        return self.c2(F.pad(x, (4, 0)))


class KeywordSpotter(nn.Module):
    """log-mel front end (stft center=False, hop 32) → causal conv → GRU → per-frame logits."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("window", torch.hann_window(64))
        self.register_buffer("mel", torch.rand(33, 10))
        self.conv, self.gru, self.out = (
            nn.Conv1d(10, 16, 3),
            nn.GRU(16, 12, batch_first=True),
            nn.Linear(12, 4),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spec = torch.stft(x, 64, hop_length=32, window=self.window, center=False, return_complex=True).abs()
        mel = torch.log(torch.einsum("bft,fm->bmt", spec, self.mel) + 1e-3)
        h = torch.relu(self.conv(F.pad(mel, (2, 0))))
        y, _ = self.gru(h.transpose(1, 2))
        return self.out(y)


class ConvTasNet(nn.Module):
    """Strided Conv1d encoder, 1×1 mask, ConvTranspose1d overlap-add decoder (kernel not a
    multiple of the stride, padding on the decoder)."""

    def __init__(self) -> None:
        super().__init__()
        self.enc, self.mask = nn.Conv1d(1, 16, 20, stride=8), nn.Conv1d(16, 16, 1)
        self.dec = nn.ConvTranspose1d(16, 2, 20, stride=8, padding=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.enc(x))
        return self.dec(h * torch.sigmoid(self.mask(h)))


class LSTMTagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.out = nn.LSTM(8, 16, batch_first=True), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.lstm(x)[0])


class StridedDepthwise(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.dw = nn.Conv1d(8, 8, 5, stride=2, groups=8, padding=2)
        self.bn, self.pw = nn.BatchNorm1d(8), nn.Conv1d(8, 16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.pw(torch.relu(self.bn(self.dw(x))))


class GRUWithState(nn.Module):
    """An explicit initial state, constant (tract needs h0 constant to pulse)."""

    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(8, 16, batch_first=True)
        self.register_buffer("h0", torch.randn(1, 1, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gru(x, self.h0)[0]


class NormPoolSlice(nn.Module):
    """LayerNorm over features, a 'same' conv cut back to causal with x[..., :-2], pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.ln, self.conv = nn.LayerNorm(8), nn.Conv1d(8, 8, 3, padding=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.ln(x.transpose(1, 2)).transpose(1, 2)
        y = self.conv(y)[..., :-2]
        return F.max_pool1d(F.avg_pool1d(y, 2), 3, stride=1, padding=1)


class RunningSum(nn.Module):
    """A cumulative sum over the streaming axis (a scan with a running state in tract)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumsum(self.conv(x), dim=2) / 8


class ConvSTFTDenoiser(nn.Module):
    """STFT → mask → iSTFT written with real convolutions (DCCRN's ConvSTFT / ConviSTFT): a
    strided Conv1d with the windowed DFT basis, a mask from the magnitudes, and a
    ConvTranspose1d overlap-add with the inverse basis (torch.istft itself needs a static frame
    count in torchlower today)."""

    def __init__(self, n_fft: int = 64, hop: int = 16) -> None:
        super().__init__()
        window = torch.hann_window(n_fft, periodic=True) ** 0.5
        k = torch.arange(n_fft // 2 + 1, dtype=torch.float64)[:, None]
        n = torch.arange(n_fft, dtype=torch.float64)[None, :]
        basis = torch.cat([torch.cos(2 * torch.pi * k * n / n_fft), -torch.sin(2 * torch.pi * k * n / n_fft)])
        forward = (basis * window).float()[:, None, :]  # (2F, 1, n_fft)
        inverse = (torch.linalg.pinv(basis).T * window * hop / n_fft * 2).float()[:, None, :]
        self.register_buffer("forward_basis", forward)
        self.register_buffer("inverse_basis", inverse)
        self.hop, self.bins = hop, n_fft // 2 + 1
        self.mask = nn.Conv1d(self.bins, self.bins, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spec = F.conv1d(x, self.forward_basis, stride=self.hop)  # (B, 2F, frames)
        re, im = spec[:, : self.bins], spec[:, self.bins :]
        gain = torch.sigmoid(self.mask(torch.sqrt(re * re + im * im + 1e-8)))
        masked = torch.cat([re * gain, im * gain], dim=1)
        return F.conv_transpose1d(masked, self.inverse_basis, stride=self.hop)


class CenteredSTFT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("window", torch.hann_window(64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stft(x, 64, hop_length=16, window=self.window, center=True, return_complex=True).abs()


class SelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x)[0]


class GlobalMean(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x - x.mean(dim=2, keepdim=True)


# name, factory, example, dynamic axes, export pulse, second pulse, expected delay
ZOO = [
    ("tcn", CausalTCN, (1, 4, 64), {"x": {2: "T"}}, 16, 40, 0),
    ("kws", KeywordSpotter, (1, 1024), {"x": {1: "T"}}, 128, 32, 1),
    ("tasnet", ConvTasNet, (1, 1, 256), {"x": {2: "T"}}, 64, 16, 19),
    ("lstm", LSTMTagger, (1, 40, 8), {"x": {1: "T"}}, 8, 5, 0),
    ("depthwise", StridedDepthwise, (1, 8, 64), {"x": {2: "T"}}, 16, 6, 1),
    ("gru_h0", GRUWithState, (1, 40, 8), {"x": {1: "T"}}, 8, 3, 0),
    ("norm_pool_slice", NormPoolSlice, (1, 8, 64), {"x": {2: "T"}}, 16, 4, 1),
    ("cumsum", RunningSum, (1, 4, 64), {"x": {2: "T"}}, 16, 7, 0),
    ("stft_denoiser", ConvSTFTDenoiser, (1, 1, 512), {"x": {2: "T"}}, 64, 32, 48),
]


def test_real_package_model_streams(tmp_path: Path) -> None:
    """torchaudio's Wav2Letter (MFCC input: a stride-2 conv, then 'same' convs with look-ahead)."""
    models = pytest.importorskip("torchaudio.models")
    torch.manual_seed(0)
    model = models.Wav2Letter(num_classes=20, input_type="mfcc", num_features=13).eval()
    path = tmp_path / "w2l.nnef.tgz"
    report = torchlower.export(
        model, (torch.randn(1, 13, 200),), path, dynamic_axes={"x": {2: "T"}}, stream={"T": 16}
    )
    s = report.stream
    assert (s.delay, s.multiple) == (48, 2)
    assert all(e.ok and e.max_abs <= e.tolerance / 10 for p in s.points for e in p.errors)
    again = verify_stream(path, torchlower.load(path).graph, model, {"T": 32})
    assert again.delay == 48 and all(e.max_abs <= e.tolerance / 10 for p in again.points for e in p.errors)


def model_of(factory: type[nn.Module]) -> nn.Module:
    torch.manual_seed(0)
    return factory().eval()


@pytest.mark.parametrize(
    ("name", "factory", "shape", "axes", "pulse", "second", "delay"), ZOO, ids=[z[0] for z in ZOO]
)
def test_zoo_streams_like_pytorch(
    tmp_path: Path, name: str, factory: type[nn.Module], shape: tuple[int, ...], axes: dict, pulse: int,
    second: int, delay: int,
) -> None:  # fmt: skip
    model = model_of(factory)
    path = tmp_path / f"{name}.nnef.tgz"
    symbol = "T"
    report = torchlower.export(model, (torch.randn(shape),), path, dynamic_axes=axes, stream={symbol: pulse})
    s = report.stream
    assert (s.symbol, s.pulse, s.delay) == (symbol, pulse, delay)
    assert len({p.length for p in s.points}) == 3  # three input lengths
    for p in s.points:
        for e in p.errors:
            assert e.ok and e.max_abs <= 1e-5 * (e.tolerance / 1e-4)  # 1e-5 of the output scale
    assert s.chunk_seconds and all(t > 0 for t in s.chunk_seconds)
    recorded = torchlower.inspect(path, tract=False)["streaming"]
    assert recorded["pulse"] == pulse and recorded["delay"] == delay and recorded["symbol"] == symbol
    # a second pulse, through the API, against the same model
    art = torchlower.load(path)
    again = verify_stream(path, art.graph, model, {symbol: second})
    assert again.pulse == second and all(
        e.max_abs <= e.tolerance / 10 for p in again.points for e in p.errors
    )
    assert len(again.points) == 3


def test_stream_object_push_matches_whole_run(tmp_path: Path) -> None:
    model = model_of(ConvTasNet)
    path = tmp_path / "tasnet.nnef.tgz"
    torchlower.export(model, (torch.randn(1, 1, 256),), path, dynamic_axes={"x": {2: "T"}}, stream={"T": 64})
    x = np.random.default_rng(3).standard_normal((1, 1, 300)).astype(np.float32)
    with torchlower.load(path).stream({"T": 32}) as stream:
        assert (stream.pulse, stream.delay) == (32, 19)
        ext = np.concatenate([x, np.zeros((1, 1, 3 * 32 - 300 % 32 + 32), np.float32)], axis=2)
        pieces = [stream.push({"x": ext[..., k : k + 32]})["output"] for k in range(0, ext.shape[2], 32)]
        streamed = np.concatenate(pieces, axis=2)[..., stream.delay :]
        want = model(torch.from_numpy(ext)).detach().numpy()
        n = min(streamed.shape[2], want.shape[2])
        assert n >= 300 - 8
        assert np.abs(streamed[..., :n] - want[..., :n]).max() < 1e-5
        with pytest.raises(InvalidArgumentError, match="each chunk must have 32 steps"):
            stream.push({"x": np.zeros((1, 1, 20), np.float32)})
        with pytest.raises(InvalidArgumentError, match="float64"):
            stream.push({"x": np.zeros((1, 1, 32), np.float64)})
        stream.reset()
        run = stream.run({"x": x})
        assert run.outputs["output"].shape == (1, 2, 300)
        head = model(torch.from_numpy(x)).detach().numpy()[..., :280]  # before the end of the input
        assert np.abs(run.outputs["output"][..., :280] - head).max() < 1e-5
    with pytest.raises(InvalidPulseError, match="multiples of 8"):
        torchlower.load(path).stream({"T": 12})
    with pytest.raises(InvalidArgumentError, match=r"not a symbol .*the archive declares"):
        torchlower.load(path).stream({"S": 16})


def test_strided_deconv_without_stream_export_is_refused(tmp_path: Path) -> None:
    """tract pulses a strided deconv with a wrong delay: an archive written without stream= keeps
    the deconv, and streaming it is refused rather than run wrong."""
    path = tmp_path / "plain.nnef.tgz"
    torchlower.export(model_of(ConvTasNet), (torch.randn(1, 1, 256),), path, dynamic_axes={"x": {2: "T"}})
    with pytest.raises(StreamingError, match=r"module 'dec'.*wrong delay"):
        torchlower.load(path).stream({"T": 64})


def test_wrong_stream_is_a_check_error_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the pulse-safe decoder (and its refusal) tract's own pulsed deconv streams wrong
    numbers: the streaming check must catch that and write nothing."""
    from torchlower.pipeline import export as export_module

    monkeypatch.setattr(export_module.stream_forms, "pulse_safe", lambda b: [])
    monkeypatch.setattr(export_module, "refuse_hazards", lambda b, s: (1, None))
    path = tmp_path / "wrong.nnef.tgz"
    with pytest.raises(CheckError, match="differ from PyTorch on the whole input"):
        torchlower.export(
            model_of(ConvTasNet),
            (torch.randn(1, 1, 256),),
            path,
            dynamic_axes={"x": {2: "T"}},
            stream={"T": 64},
        )
    assert list(tmp_path.iterdir()) == []


def test_global_pooling_over_time_is_a_streaming_error(tmp_path: Path) -> None:
    path = tmp_path / "mean.nnef.tgz"
    with pytest.raises(
        StreamingError, match=r"mean_reduce.*whole sequence.*GlobalMean.forward at .*test_streaming.py:\d+"
    ):
        torchlower.export(
            GlobalMean(), (torch.randn(1, 8, 64),), path, dynamic_axes={"x": {2: "T"}}, stream={"T": 16}
        )
    assert not path.exists()


def test_center_true_stft_says_use_center_false(tmp_path: Path) -> None:
    path = tmp_path / "stft.nnef.tgz"
    with pytest.raises(StreamingError, match="use center=False"):
        torchlower.export(
            CenteredSTFT(), (torch.randn(1, 512),), path, dynamic_axes={"x": {1: "T"}}, stream={"T": 64}
        )
    assert not path.exists()


def test_attention_over_time_never_streams_wrong(tmp_path: Path) -> None:
    """tract pulses self-attention as attention within each chunk: the streaming check fails, as a
    StreamingError naming the product and its module, and an unverified archive is refused by
    load().stream."""
    model = model_of(SelfAttention)
    path = tmp_path / "attn.nnef.tgz"
    with pytest.raises(
        StreamingError, match=r"differ from PyTorch.*matmul of two computed tensors.*forward at"
    ):
        torchlower.export(
            model, (torch.randn(1, 40, 8),), path, dynamic_axes={"x": {1: "T"}}, stream={"T": 8}
        )
    assert not path.exists()
    torchlower.export(model, (torch.randn(1, 40, 8),), path, dynamic_axes={"x": {1: "T"}})
    with pytest.raises(StreamingError, match="attention"):
        torchlower.load(path).stream({"T": 8})


class GRUStateInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(8, 16, batch_first=True)

    def forward(self, x: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        return self.gru(x, h0)[0]


def test_initial_state_as_an_input_is_refused(tmp_path: Path) -> None:
    args = (torch.randn(1, 40, 8), torch.randn(1, 1, 16))
    with pytest.raises(StreamingError, match=r"input 'h0' has no T axis.*register_buffer"):
        torchlower.export(
            GRUStateInput(), args, tmp_path / "g.nnef.tgz", dynamic_axes={"x": {1: "T"}}, stream={"T": 8}
        )
    assert list(tmp_path.iterdir()) == []


def test_stream_arguments(tmp_path: Path) -> None:
    x = (torch.randn(1, 4, 64),)
    with pytest.raises(InvalidArgumentError, match="not a symbol of the dynamic axes"):
        torchlower.export(
            CausalTCN(), x, tmp_path / "a.nnef.tgz", dynamic_axes={"x": {2: "T"}}, stream={"S": 16}
        )
    with pytest.raises(InvalidArgumentError, match="positive integer"):
        torchlower.export(
            CausalTCN(), x, tmp_path / "a.nnef.tgz", dynamic_axes={"x": {2: "T"}}, stream={"T": 0}
        )
    with pytest.raises(InvalidPulseError, match="multiples of 32"):
        torchlower.export(
            model_of(KeywordSpotter), (torch.randn(1, 1024),), tmp_path / "k.nnef.tgz",
            dynamic_axes={"x": {1: "T"}}, stream={"T": 48},
        )  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_archive_without_stream_has_no_streaming_comment(tmp_path: Path) -> None:
    path = tmp_path / "plain.nnef.tgz"
    torchlower.export(CausalTCN(), (torch.randn(1, 4, 64),), path, dynamic_axes={"x": {2: "T"}})
    assert "# streaming" not in torchlower.artifact.io.graph_text(path)
    assert torchlower.inspect(path, tract=False)["streaming"] is None


MODELS_PY = """
from tests.test_streaming import CausalTCN, ConvTasNet, model_of

def tcn():
    return model_of(CausalTCN)

def tasnet():
    return model_of(ConvTasNet)
"""

# factory, example, streamed input, pulses (export, check, run), delay, output steps compared
CLI_CASES = [
    ("tcn", CausalTCN, "x:1x4x64", (1, 4, 100), ("16", "24", "32"), 0, 100),
    ("tasnet", ConvTasNet, "x:1x1x256", (1, 1, 300), ("64", "16", "32"), 19, 260),
]


@pytest.mark.parametrize(("name", "factory", "example", "shape", "pulses", "delay", "compared"), CLI_CASES,
                         ids=[c[0] for c in CLI_CASES])  # fmt: skip
def test_cli_export_check_run_inspect(
    tmp_path: Path, name: str, factory: type[nn.Module], example: str, shape: tuple[int, ...],
    pulses: tuple[str, str, str], delay: int, compared: int,
) -> None:  # fmt: skip
    (tmp_path / "zoo_models.py").write_text(MODELS_PY)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))

    def cli(*args: str) -> dict:
        proc = subprocess.run(
            [sys.executable, "-m", "torchlower", *args, "--json"], capture_output=True, text=True, env=env,
            cwd=tmp_path, timeout=600,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr + proc.stdout
        return json.loads(proc.stdout)

    exported = cli(
        "export", f"zoo_models:{name}", "--input", example, "--dynamic", "x:2=T", "-o", "t.nnef.tgz",
        "--stream", f"T={pulses[0]}",
    )  # fmt: skip
    assert exported["stream"]["pulse"] == int(pulses[0]) and exported["stream"]["delay"] == delay
    assert exported["stream"]["max_abs_error"] <= 1e-5
    shown = cli("inspect", "t.nnef.tgz", "--no-shapes")["streaming"]
    assert shown["pulse"] == int(pulses[0]) and shown["delay"] == delay
    checked = cli("check", "t.nnef.tgz", "--stream", f"T={pulses[1]}", "--model", f"zoo_models:{name}")
    assert checked["stream"]["pulse"] == int(pulses[1]) and checked["stream"]["max_abs_error"] <= 1e-5
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    ran = cli("run", "t.nnef.tgz", "--stream", f"T={pulses[2]}", "--inputs", "in.npz", "--out", "out.npz")
    assert ran["delay"] == delay and ran["real_time_factor"] > 0
    with np.load(tmp_path / "out.npz") as data:
        got = data["output"]
    want = model_of(factory)(torch.from_numpy(x)).detach().numpy()
    assert got.shape[2] == shape[2]  # the steps the input covers, delay dropped
    assert np.abs(got[..., :compared] - want[..., :compared]).max() < 1e-5

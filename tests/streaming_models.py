"""The streaming zoo of tests/test_streaming*.py and bench/streaming.py: small models of the
layers speech models stream with (issue 29), each with seeded weights through ``model_of``."""

from __future__ import annotations

import functools
import types
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn


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


class LSTMWithState(nn.Module):
    """Two layers with a constant (h0, c0)."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
        self.register_buffer("h0", torch.randn(2, 1, 16))
        self.register_buffer("c0", torch.randn(2, 1, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x, (self.h0, self.c0))[0]


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
    count in torchlower until the complex-tensor work; ``STFTDenoiser`` is the same
    with ``torch.stft`` / ``torch.istft``)."""

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


class STFTDenoiser(nn.Module):
    """``torch.stft(center=False, return_complex=True)`` → a real mask (sigmoid of a 1×1 conv over
    |X|) → complex multiply → ``torch.istft(center=False)``; hop 16 divides n_fft 64. The window is
    the sine window (the square root of a Hann shifted by half a sample): a periodic sqrt-Hann is 0
    at sample 0, which ``torch.istft``'s NOLA check rejects with ``center=False``."""

    def __init__(self, n_fft: int = 64, hop: int = 16) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("window", torch.sin(torch.pi * (torch.arange(n_fft) + 0.5) / n_fft))
        self.mask = nn.Conv1d(n_fft // 2 + 1, n_fft // 2 + 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spec = torch.stft(
            x, self.n_fft, hop_length=self.hop, window=self.window, center=False, return_complex=True
        )
        gain = torch.sigmoid(self.mask(spec.abs()))  # (B, F, frames), real
        return torch.istft(spec * gain, self.n_fft, hop_length=self.hop, window=self.window, center=False)


class MFCCSpotter(nn.Module):
    """torchaudio's ``MFCC`` as shipped (16 kHz, 25 ms window, 10 ms hop, ``center=False``) →
    causal conv → GRU → per-frame logits. ``log_mels=True``: the default dB scale clamps every value
    to ``top_db`` below the maximum over the whole spectrogram, which cannot stream."""

    log_mels = True

    def __init__(self) -> None:
        super().__init__()
        from tests import torchvision_shim

        torchvision_shim.install_torchaudio()
        import torchaudio

        melkwargs = {"n_fft": 400, "hop_length": 160, "n_mels": 40, "center": False}
        self.mfcc = torchaudio.transforms.MFCC(16000, 13, melkwargs=melkwargs, log_mels=self.log_mels)
        self.conv, self.gru, self.out = (
            nn.Conv1d(13, 16, 3),
            nn.GRU(16, 12, batch_first=True),
            nn.Linear(12, 4),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(F.pad(self.mfcc(x), (2, 0))))
        return self.out(self.gru(h.transpose(1, 2))[0])


class MFCCdBSpotter(MFCCSpotter):
    """The default ``MFCC`` (dB scale with ``top_db=80``: a max over the whole input)."""

    log_mels = False


class MelDB(nn.Module):
    """torchaudio's ``MelSpectrogram(center=False)`` → ``AmplitudeToDB(top_db=None)`` alone, as
    shipped (without ``top_db`` the dB scale is elementwise)."""

    def __init__(self) -> None:
        super().__init__()
        from tests import torchvision_shim

        torchvision_shim.install_torchaudio()
        import torchaudio

        self.mel = torchaudio.transforms.MelSpectrogram(16000, 400, hop_length=160, n_mels=40, center=False)
        self.db = torchaudio.transforms.AmplitudeToDB(top_db=None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.db(self.mel(x))


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


class GRUStateInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.GRU(8, 16, batch_first=True)

    def forward(self, x: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        return self.gru(x, h0)[0]


def wav2letter() -> nn.Module:
    """torchaudio's ``Wav2Letter`` (MFCC input: a stride-2 conv, then 'same' convs with look-ahead),
    the real package model of the zoo (23 M parameters: the costliest export of the zoo)."""
    from tests import torchvision_shim

    torchvision_shim.install_torchaudio()
    from torchaudio.models import Wav2Letter

    return Wav2Letter(num_classes=20, input_type="mfcc", num_features=13)


def model_of(factory: Any) -> nn.Module:
    torch.manual_seed(0)
    return factory().eval()


class Case(NamedTuple):
    """A zoo model: its example, streaming axis, the export pulse, a second pulse, the delay
    tract reports (in steps of the output's streaming axis) and the input steps per output step."""

    name: str
    factory: Any
    shape: tuple[int, ...]
    axis: int
    pulse: int
    second: int
    delay: int
    stride: int


ZOO = [
    Case("tcn", CausalTCN, (1, 4, 64), 2, 16, 40, 0, 1),
    Case("kws", KeywordSpotter, (1, 1024), 1, 128, 32, 1, 32),
    Case("tasnet", ConvTasNet, (1, 1, 256), 2, 64, 16, 19, 1),
    Case("lstm", LSTMTagger, (1, 40, 8), 1, 8, 5, 0, 1),
    Case("depthwise", StridedDepthwise, (1, 8, 64), 2, 16, 6, 1, 2),
    Case("gru_h0", GRUWithState, (1, 40, 8), 1, 8, 3, 0, 1),
    Case("lstm_h0_c0", LSTMWithState, (1, 40, 8), 1, 4, 10, 0, 1),
    Case("norm_pool_slice", NormPoolSlice, (1, 8, 64), 2, 16, 4, 1, 2),
    Case("cumsum", RunningSum, (1, 4, 64), 2, 16, 7, 0, 1),
    Case("convstft_denoiser", ConvSTFTDenoiser, (1, 1, 512), 2, 64, 32, 48, 1),
    Case("stft_denoiser", STFTDenoiser, (1, 512), 1, 64, 32, 48, 1),  # torch.stft / torch.istft
    Case("torchaudio_mfcc", MFCCSpotter, (1, 4000), 1, 160, 320, 2, 160),  # 10 and 20 ms
    Case("torchaudio_mel_db", MelDB, (1, 4000), 1, 320, 160, 2, 160),
]

# torchaudio's Wav2Letter (23 M parameters): its export alone takes 15 s, so the suite streams it
# through the API (tests/test_streaming.py) and the CLI round trip takes the zoo above
WAV2LETTER = Case("torchaudio_wav2letter", wav2letter, (1, 13, 200), 2, 16, 32, 48, 2)

# zero-argument seeded factories for the CLI: ``tests.streaming_models:seeded.tcn``
seeded = types.SimpleNamespace(**{c.name: functools.partial(model_of, c.factory) for c in [*ZOO, WAV2LETTER]})

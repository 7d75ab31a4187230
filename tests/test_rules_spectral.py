"""FFT, STFT / ISTFT and complex values (a trailing [re, im] axis in tract) through every front end, and
the speech front ends built on them — Spectrogram → MelSpectrogram → log-mel / MFCC written with
torchaudio's formulas in plain torch (torchaudio is not a dependency), on a dynamic time axis.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

import torchlower
from tests.conftest import Fn, export_and_check
from torchlower.errors import LoweringError, UnsupportedOpsError
from torchlower.nnef.tract import run_in_tract


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _c(*shape: int) -> torch.Tensor:
    """A complex tensor as its view_as_real (inputs stay real: tract has no complex type)."""
    return torch.view_as_real(torch.randn(*shape, dtype=torch.complex64))


def _vr(z: torch.Tensor) -> torch.Tensor:
    return torch.view_as_real(z)


def _vc(x: torch.Tensor) -> torch.Tensor:
    return torch.view_as_complex(x)


HANN16 = torch.hann_window(16)

CASES: dict[str, tuple[Callable[..., object], tuple[torch.Tensor, ...]]] = {
    "rfft": (lambda x: _vr(torch.fft.rfft(x)), (_r(3, 10),)),
    "rfft_n_dim_ortho": (lambda x: _vr(torch.fft.rfft(x, n=16, dim=0, norm="ortho")), (_r(10, 3),)),
    "rfft_truncated": (lambda x: _vr(torch.fft.rfft(x, n=7)), (_r(2, 10),)),
    "fft_of_real_forward_norm": (lambda x: _vr(torch.fft.fft(x, norm="forward")), (_r(3, 8),)),
    "fft_complex_padded": (lambda x: _vr(torch.fft.fft(_vc(x), n=11)), (_c(3, 8),)),
    "ifft": (lambda x: _vr(torch.fft.ifft(_vc(x), dim=0)), (_c(5, 4),)),
    "ifft_ortho": (lambda x: _vr(torch.fft.ifft(_vc(x), norm="ortho")), (_c(2, 6),)),
    "irfft_roundtrip": (lambda x: torch.fft.irfft(torch.fft.rfft(x)), (_r(3, 10),)),
    "irfft_odd_n": (lambda x: torch.fft.irfft(_vc(x), n=9, norm="ortho"), (_c(2, 6),)),
    "irfft_even_n_forward": (lambda x: torch.fft.irfft(_vc(x), n=8, norm="forward"), (_c(2, 5),)),
    "fftn_abs": (lambda x: torch.fft.fftn(x, dim=(0, 1)).abs(), (_r(4, 6),)),
    "ifftn": (lambda x: _vr(torch.fft.ifftn(_vc(x), s=(4, 6), dim=(0, 1), norm="ortho")), (_c(3, 5),)),
    "aten_fft_primitives": (  # what torch.export decomposes torch.fft.* into
        lambda x: (
            _vr(torch.ops.aten._fft_r2c(x, [1], 1, True)),
            _vr(torch.ops.aten._fft_c2c(torch.ops.aten._fft_r2c(x, [1], 0, False), [0, 1], 2, False)),
            torch.ops.aten._fft_c2r(torch.ops.aten._fft_r2c(x, [1], 0, True), [1], 2, 8),
        ),
        (_r(3, 8),),
    ),
    "conj_physical_resolve_conj": (
        lambda x: (_vr(torch.conj_physical(_vc(x))), _vr(_vc(x).conj().resolve_conj())),
        (_c(2, 3),),
    ),
    "fft2_ifft2_real": (lambda x: torch.fft.ifft2(torch.fft.fft2(x)).real, (_r(2, 4, 6),)),
    "abs_angle": (lambda x: (torch.fft.rfft(x).abs(), torch.fft.rfft(x).angle()), (_r(3, 10),)),
    "real_imag": (lambda x: (torch.fft.rfft(x).real, torch.fft.rfft(x).imag), (_r(3, 10),)),
    "complex_products": (
        lambda x, y: _vr(torch.fft.rfft(x) * torch.fft.rfft(y) * 2.0 - torch.fft.rfft(y)),
        (_r(3, 10), _r(3, 10)),
    ),
    "conj_product_is_power": (lambda x: (torch.fft.rfft(x) * torch.fft.rfft(x).conj()).real, (_r(2, 12),)),
    "power_spectrum": (lambda x: torch.fft.rfft(x).abs().pow(2), (_r(3, 10),)),
    "view_as_complex_roundtrip": (lambda x: _vr(_vc(x) * _vc(x)), (_c(4, 3),)),
    "stft_centered_hann": (
        lambda x: torch.stft(x, 16, hop_length=4, window=HANN16, center=True, return_complex=True).abs(),
        (_r(2, 64),),
    ),
    "stft_short_window_normalized": (
        lambda x: _vr(
            torch.stft(
                x,
                16,
                hop_length=5,
                win_length=12,
                window=torch.hann_window(12),
                center=False,
                normalized=True,
                return_complex=True,
            )
        ),
        (_r(2, 64),),
    ),
    "stft_1d_two_sided": (
        lambda x: _vr(torch.stft(x, 8, hop_length=2, center=False, onesided=False, return_complex=True)),
        (_r(40),),
    ),
    "istft_roundtrip": (
        lambda x: torch.istft(torch.stft(x, 16, 4, window=HANN16, return_complex=True), 16, 4, window=HANN16),
        (_r(2, 64),),
    ),
    "istft_length": (
        lambda x: torch.istft(
            torch.stft(x, 16, 4, window=HANN16, return_complex=True), 16, 4, window=HANN16, length=60
        ),
        (_r(2, 64),),
    ),
    "istft_of_any_spectrum": (  # not Hermitian at DC: torch's C2R ignores those imaginary parts
        lambda z: torch.istft(_vc(z), 16, 4, window=torch.hamming_window(16), center=False, normalized=True),
        (torch.randn(1, 9, 17, 2),),
    ),
    "stft_constant_pad": (
        lambda x: torch.stft(x, 16, 8, window=HANN16, pad_mode="constant", return_complex=True).abs(),
        (_r(1, 50),),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_spectral(case: str, tmp_path, frontend) -> None:
    fn, args = CASES[case]
    export_and_check(Fn(fn), args, tmp_path, frontend)


def test_complex_output_is_refused(tmp_path) -> None:
    with pytest.raises(LoweringError, match="view_as_real"):
        torchlower.export(Fn(torch.fft.rfft), (_r(3, 8),), tmp_path / "m.nnef.tgz", frontend="jit")
    assert not (tmp_path / "m.nnef.tgz").exists()


def test_real_rule_never_sees_a_complex_tensor(tmp_path) -> None:
    """sin of a complex tensor has no complex-aware rule: reported by name, not misread as real."""
    with pytest.raises(UnsupportedOpsError, match=r"aten::sin \(on a complex tensor\)"):
        torchlower.export(Fn(lambda x: torch.fft.rfft(x).sin().abs()), (_r(3, 8),), tmp_path / "m.nnef.tgz")


# ---- speech front ends (torchaudio's formulas, filterbanks as constants) ---------------------
def _hz_to_mel(f: float) -> float:
    return 2595.0 * math.log10(1.0 + f / 700.0)


def mel_filterbank(n_freqs: int, n_mels: int, sample_rate: int) -> torch.Tensor:
    """torchaudio.functional.melscale_fbanks (HTK scale, no norm): (n_freqs, n_mels)."""
    all_freqs = torch.linspace(0, sample_rate // 2, n_freqs)
    m_pts = torch.linspace(_hz_to_mel(0.0), _hz_to_mel(sample_rate / 2), n_mels + 2)
    f_pts = 700.0 * (10 ** (m_pts / 2595.0) - 1.0)
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts.unsqueeze(0) - all_freqs.unsqueeze(1)
    down = (-1.0 * slopes[:, :-2]) / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    return torch.max(torch.zeros(1), torch.min(down, up))


def dct_matrix(n_mfcc: int, n_mels: int) -> torch.Tensor:
    """torchaudio.functional.create_dct(norm='ortho'): (n_mels, n_mfcc)."""
    n = torch.arange(float(n_mels))
    k = torch.arange(float(n_mfcc)).unsqueeze(1)
    dct = torch.cos(math.pi / float(n_mels) * (n + 0.5) * k)
    dct[0] *= 1.0 / math.sqrt(2.0)
    dct *= math.sqrt(2.0 / float(n_mels))
    return dct.t()


class Spectrogram(nn.Module):
    def __init__(self, n_fft: int = 64, hop: int = 16) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        self.register_buffer("window", torch.hann_window(n_fft))

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        spec = torch.stft(wave, self.n_fft, self.hop, window=self.window, center=True, pad_mode="reflect",
                          return_complex=True)  # fmt: skip
        return spec.abs().pow(2.0)


class MelSpectrogram(nn.Module):
    def __init__(self, n_fft: int = 64, hop: int = 16, n_mels: int = 12, sample_rate: int = 8000) -> None:
        super().__init__()
        self.spectrogram = Spectrogram(n_fft, hop)
        self.register_buffer("fb", mel_filterbank(n_fft // 2 + 1, n_mels, sample_rate))

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        spec = self.spectrogram(wave)
        return torch.matmul(spec.transpose(-1, -2), self.fb).transpose(-1, -2)


class LogMel(nn.Module):
    """Whisper-style: log10 of the clamped mel energies, floored 8 dB below the maximum."""

    def __init__(self) -> None:
        super().__init__()
        self.mel = MelSpectrogram()

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        log_spec = torch.clamp(self.mel(wave), min=1e-10).log10()
        log_spec = torch.maximum(log_spec, log_spec.amax(dim=(-2, -1), keepdim=True) - 8.0)
        return (log_spec + 4.0) / 4.0


class MFCC(nn.Module):
    """torchaudio.transforms.MFCC: AmplitudeToDB(power, top_db=80) of the mel spectrogram, then DCT."""

    def __init__(self, n_mfcc: int = 8) -> None:
        super().__init__()
        self.mel = MelSpectrogram()
        self.register_buffer("dct", dct_matrix(n_mfcc, 12))

    def forward(self, wave: torch.Tensor) -> torch.Tensor:
        db = 10.0 * torch.log10(torch.clamp(self.mel(wave), min=1e-10))
        db = torch.max(db, db.amax(dim=(-2, -1), keepdim=True) - 80.0)
        return torch.matmul(db.transpose(-1, -2), self.dct).transpose(-1, -2)


FRONT_ENDS = {"spectrogram": Spectrogram, "mel": MelSpectrogram, "log_mel": LogMel, "mfcc": MFCC}


@pytest.mark.parametrize("name", sorted(FRONT_ENDS))
def test_speech_front_end(name: str, tmp_path, frontend) -> None:
    export_and_check(FRONT_ENDS[name](), (torch.randn(2, 400),), tmp_path, frontend)


@pytest.mark.parametrize("name", ["mel", "mfcc"])
def test_speech_front_end_on_a_dynamic_time_axis(name: str, tmp_path, frontend) -> None:
    """One artifact, run at three signal lengths (frame counts 21, 26, 35), each against torch.

    Under torch.export the reflect padding's ``T >= 33`` (PyTorch fails below it) is adopted as the
    axis' bound and asserted in the artifact (``frontends/export.py:_model_bounds``)."""
    model = FRONT_ENDS[name]().eval()
    report = torchlower.export(
        model, (torch.randn(2, 400),), tmp_path / "m.nnef.tgz", frontend=frontend,
        dynamic_axes={"wave": {1: "T"}},
    )  # fmt: skip
    assert report.inputs[0].shape[1] == "T"
    if frontend == "export":
        assert any("33 <= T" in note for note in report.notes), report.notes
    for length in (320, 400, 555):
        wave = torch.randn(2, length)
        with torch.no_grad():
            want = model(wave).numpy()
        got = run_in_tract(report.path, [wave.numpy()])[0]
        assert got.shape == want.shape, (length, got.shape, want.shape)
        worst = float(np.abs(got - want).max())
        assert worst <= 2e-3 * max(1.0, float(np.abs(want).max())), (length, worst)

"""Speech front ends as shipped (issues 28 and 30): torchaudio's ``Spectrogram``, ``MelSpectrogram``
and ``MFCC`` (torchaudio 2.11.0, the pinned release), openai-whisper's ``log_mel_spectrogram``
and speechbrain's ``Fbank`` / ``MFCC``, exported from a batch-1 example with batch and time
dynamic, checked by the export at other sizes and run here at three more, each in tract against
PyTorch; torchaudio's ``HDemucs`` at its example size.

torchaudio's ``Spectrogram`` packs ``[..., T]`` to ``[-1, T]`` before the STFT and reshapes the
complex result back (``rules/complex_views.py``); ``MFCC`` branches on ``x.dim()`` (FX reads the
rank from the real run).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import torchlower
import torchlower.errors
from tests.conftest import export_and_check, frontend_limit
from torchlower.errors import TraceError
from torchlower.nnef.tract import run_in_tract

torchaudio = pytest.importorskip("torchaudio")  # requirements-dev.txt; tests/conftest.py shims it

EXAMPLE = (1, 16000)  # one second of 16 kHz audio, batch 1
# the export's own check points at other sizes (pipeline/check.py: a symbol at 1 is checked at 2)
CHECKED = {"B=2, T=8000": (2, 8000), "B=5, T=16004": (5, 16004)}
MORE = [(1, 4321), (3, 48000), (2, 401)]  # run here besides: odd, three seconds, a few frames
DYNAMIC = {"waveform": {0: "B", 1: "T"}}
# whisper's ``[..., :-1]`` leaves one frame for 200 <= T < 320, a size torch.export specializes
# (it asks for 320 <= T; eager runs below, so only frontend="export" adopts it, see
# test_torch_export_bound_adopted_when_undeclared): declared here, so auto takes export too
BOUNDED = {"waveform": {0: "B", 1: ("T", 320, None)}}


class WhisperLogMel(nn.Module):
    """openai-whisper's ``log_mel_spectrogram`` (whisper/audio.py, v20250625), its code as written:
    ``stft[..., :-1].abs() ** 2`` drops the last frame, then the mel filters, ``log10``, the floor
    8 below the maximum and the scale. Its filters are librosa's Slaney mel bank (read from
    ``mel_filters.npz``); torchaudio's ``melscale_fbanks(norm="slaney", mel_scale="slaney")`` is the
    same bank, so whisper itself is not installed."""

    def __init__(self, n_mels: int = 80) -> None:
        super().__init__()
        fb = torchaudio.functional.melscale_fbanks(201, 0.0, 8000.0, n_mels, 16000, "slaney", "slaney")
        self.register_buffer("filters", fb.T.contiguous())
        self.register_buffer("window", torch.hann_window(400))

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        stft = torch.stft(audio, 400, 160, window=self.window, return_complex=True)
        magnitudes = stft[..., :-1].abs() ** 2
        mel_spec = self.filters @ magnitudes
        log_spec = torch.clamp(mel_spec, min=1e-10).log10()
        log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
        return (log_spec + 4.0) / 4.0


def _models() -> dict[str, nn.Module]:
    t = torchaudio.transforms
    return {
        "spectrogram": t.Spectrogram(),  # torchaudio's defaults: n_fft 400, hop 200, power 2
        "mel_spectrogram": t.MelSpectrogram(16000, n_fft=400, hop_length=160, n_mels=80),
        "mfcc": t.MFCC(16000, n_mfcc=13, melkwargs={"n_fft": 400, "hop_length": 160, "n_mels": 40}),
        "mfcc_defaults": t.MFCC(),  # 40 coefficients of 128 mels, top_db 80
        "spectrogram_window_normalized": t.Spectrogram(normalized=True),  # spec_f /= (in place, complex)
        "lfcc": t.LFCC(16000),  # linear filterbank, dB, DCT
        "spectral_centroid": t.SpectralCentroid(16000),
        "whisper_log_mel": WhisperLogMel(),
    }


NAMES = sorted(_models())


def _axes(name: str) -> dict[str, dict[int, object]]:
    return BOUNDED if name == "whisper_log_mel" else DYNAMIC  # type: ignore[return-value]


def _check_more(model: nn.Module, path: object) -> list[float]:
    """Run the archive at the ``MORE`` sizes; the max abs error at each (asserted small)."""
    worst = []
    for shape in MORE:
        wave = torch.randn(*shape)
        with torch.no_grad():
            want = model(wave).numpy()
        got = run_in_tract(path, [wave.numpy()])[0]  # type: ignore[arg-type]
        assert got.shape == want.shape, (shape, got.shape, want.shape)
        err = float(np.abs(got - want).max())
        assert err <= 2e-5 * max(1.0, float(np.abs(want).max())), (shape, err)
        worst.append(err)
    return worst


@pytest.mark.parametrize("name", NAMES)
def test_audio_front_end_with_batch_and_time_dynamic(name: str, tmp_path, frontend) -> None:
    model = _models()[name].eval()
    report = torchlower.export(
        model,
        (torch.randn(*EXAMPLE),),
        tmp_path / "m.nnef.tgz",
        frontend=frontend,
        input_names=["waveform"],
        dynamic_axes=_axes(name),
    )
    assert report.frontend == frontend
    assert report.inputs[0].shape == ("B", "T")
    assert report.outputs[0].shape[0] == "B" and "T" in str(report.outputs[0].shape[-1]), report.outputs
    checked = {p.label: p for p in report.points}
    for label, shape in CHECKED.items():
        assert label in checked and checked[label].inputs == [shape] and checked[label].ok, report.points
    with torch.no_grad():
        scale = max(1.0, float(model(torch.randn(*EXAMPLE)).abs().max()))
    assert checked["example"].ok and report.max_abs_error <= 2e-5 * scale, (report.max_abs_error, scale)
    _check_more(model, report.path)


@pytest.mark.parametrize("name", NAMES)
def test_audio_front_end_through_auto(name: str, tmp_path) -> None:
    """``auto`` (export first) takes each one with no note of a front end that failed."""
    model = _models()[name].eval()
    report = torchlower.export(
        model,
        (torch.randn(*EXAMPLE),),
        tmp_path / "m.nnef.tgz",
        input_names=["waveform"],
        dynamic_axes=_axes(name),
    )
    assert report.frontend == "export", report.notes
    assert not any("front end skipped" in n for n in report.notes), report.notes
    assert all(p.ok for p in report.points if p.skipped is None), report.points
    _check_more(model, report.path)


def test_hdemucs_as_shipped(request, tmp_path, frontend) -> None:
    """torchaudio's hybrid Demucs (``torchaudio.models.HDemucs``, a small configuration of the
    shipped class): STFT, ``F.pad`` and views of the complex spectrum, ``view_as_real`` into the
    frequency branch, ``view_as_complex`` of its output and ``istft`` back, plus the time branch."""
    frontend_limit(
        request, frontend, "fx", TraceError,
        "HDemucs.forward branches on input.shape[1] (FX refuses control flow on a traced size)",
    )  # fmt: skip
    model = torchaudio.models.HDemucs(["drums", "bass"], audio_channels=1, channels=4, nfft=1024, depth=4)
    report = export_and_check(model, (torch.randn(1, 1, 8192),), tmp_path, frontend)
    assert report.outputs[0].shape == (1, 2, 1, 8192)
    assert report.max_abs_error < 1e-4, report.max_abs_error


SPEECHBRAIN = ("fbank", "fbank_deltas_context", "mfcc")
# speechbrain pads with zeros (no reflect bound); torch.export specializes one frame (T < 160) and
# asks for 160 <= T (eager runs below): declared for export
SB_AXES = {"wav": {0: "B", 1: ("T", 160, None)}}


@pytest.mark.parametrize("name", SPEECHBRAIN)
def test_speechbrain_features_with_batch_and_time_dynamic(name: str, tmp_path, frontend) -> None:
    """speechbrain's ``Fbank`` (with deltas and a context window too) and ``MFCC`` as shipped
    (speechbrain 1.1.2, ``speechbrain.lobes.features``): STFT → ``view_as_real`` → magnitude → mel
    filterbank → dB, from a batch-1 example, checked at the export's sizes and three more."""
    features = pytest.importorskip("speechbrain.lobes.features")  # requirements-dev.txt
    model = {
        "fbank": lambda: features.Fbank(n_mels=40),
        "fbank_deltas_context": lambda: features.Fbank(n_mels=40, deltas=True, context=True),
        "mfcc": lambda: features.MFCC(),
    }[name]().eval()
    with torch.no_grad():  # speechbrain's Deltas builds its kernel on the first call (a Python flag);
        model(torch.randn(*EXAMPLE))  # a trace of that first call records the state write (jit, fx fail)
    report = torchlower.export(
        model, (torch.randn(*EXAMPLE),), tmp_path / "m.nnef.tgz", frontend=frontend, input_names=["wav"],
        dynamic_axes=SB_AXES,
    )  # fmt: skip
    assert report.inputs[0].shape == ("B", "T") and report.outputs[0].shape[:2] == ("B", "(1 + (T / 160))")
    checked = {p.label: p for p in report.points}
    for label, shape in CHECKED.items():
        assert label in checked and checked[label].inputs == [shape] and checked[label].ok, report.points
    assert report.max_abs_error <= 1e-4, report.max_abs_error
    _check_more(model, report.path)


def _openai_whisper_audio() -> object:
    """``whisper.audio`` of the installed openai-whisper (requirements-nodeps.txt: installed without
    its dependencies, whose triton pin is CUDA-only). Its package ``__init__`` imports the decoder
    (tiktoken, numba), so only the audio module is loaded, under a bare package."""
    import importlib.util
    import sys
    import types
    from pathlib import Path

    if "whisper.audio" in sys.modules:
        return sys.modules["whisper.audio"]
    spec = importlib.util.find_spec("whisper")
    if spec is None or spec.origin is None or not (Path(spec.origin).parent / "audio.py").exists():
        pytest.skip("openai-whisper is not installed (requirements-nodeps.txt)")
    package = types.ModuleType("whisper")
    package.__path__ = [str(Path(spec.origin).parent)]
    package.__spec__ = importlib.util.spec_from_loader("whisper", None, is_package=True)
    package.__spec__.submodule_search_locations = package.__path__
    sys.modules.setdefault("whisper", package)
    return importlib.import_module("whisper.audio")


class OpenAIWhisperLogMel(nn.Module):
    """openai-whisper's own ``log_mel_spectrogram`` with its shipped ``mel_filters.npz``."""

    def __init__(self, n_mels: int = 80) -> None:
        super().__init__()
        self.audio, self.n_mels = _openai_whisper_audio(), n_mels

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        return self.audio.log_mel_spectrogram(audio, self.n_mels)  # type: ignore[attr-defined]


@pytest.mark.parametrize("frontend", ["auto", "jit", "export"])
def test_openai_whisper_log_mel_as_shipped(frontend: str, tmp_path) -> None:
    model = OpenAIWhisperLogMel().eval()
    report = torchlower.export(
        model, (torch.randn(*EXAMPLE),), tmp_path / "m.nnef.tgz", frontend=frontend,
        input_names=["waveform"], dynamic_axes=BOUNDED,
    )  # fmt: skip
    assert report.inputs[0].shape == ("B", "T") and report.outputs[0].shape[1] == 80
    checked = [p for p in report.points if p.skipped is None]
    assert all(p.ok for p in checked) and len(checked) >= 5, report.points
    assert report.max_abs_error < 1e-4
    _check_more(model, report.path)


def _speechbrain_deltas() -> nn.Module:
    features = pytest.importorskip("speechbrain.lobes.features")  # requirements-dev.txt
    model = features.Fbank(n_mels=40, deltas=True, context=True).eval()
    with torch.no_grad():
        model(torch.randn(*EXAMPLE))  # builds its delta kernel (see above)
    return model


@pytest.mark.parametrize("name", ["whisper", "speechbrain_deltas"])
def test_torch_export_bound_adopted_when_undeclared(name: str, tmp_path) -> None:
    """T left unbounded: torch.export's program holds for 320 <= T only (whisper's ``[..., :-1]``
    leaves one frame for 200 <= T < 320, a size it specializes; size-oblivious it still asks
    ``T // 160 != 1``), 160 <= T for speechbrain's deltas. PyTorch runs below; with
    ``frontend="export"`` the bound is adopted, declared, noted with the size refused and checked
    at the bound, and the archive refuses one below by name."""
    model, bound = (OpenAIWhisperLogMel().eval(), 320) if name == "whisper" else (_speechbrain_deltas(), 160)
    report = torchlower.export(
        model, (torch.randn(*EXAMPLE),), tmp_path / "m.nnef.tgz", frontend="export",
        input_names=["waveform"], dynamic_axes=DYNAMIC,
    )  # fmt: skip
    assert any(f"{bound} <= T adopted" in n and f"T={bound - 1}" in n for n in report.notes), report.notes
    at = {p.label: p for p in report.points}
    assert at[f"B=1, T={bound}"].ok and all(p.ok for p in at.values() if p.skipped is None), report.points
    assert f"tract_assert T >= {bound}" in torchlower.inspect(report.path)["extensions"]
    with torchlower.load(report.path) as art:
        assert art.run([np.zeros((1, bound), np.float32)])["output"].shape[0] == 1
        with pytest.raises(torchlower.errors.InvalidArgumentError, match=f"T = {bound - 1}"):
            art.run([np.zeros((1, bound - 1), np.float32)])

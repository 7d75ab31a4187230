"""Speech models from pip packages besides transformers, for ``bench/dynamic_sweep.py``: the time
axis dynamic, batch-1 examples, random weights (silero-vad: its shipped ``silero_vad.jit``), no
download. Each entry builds ``(model, example, {input: {axis: symbol}})``; an example that is a
tuple names its inputs ``in0``, ``in1``… (the dynamic axes use those names)."""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _seeded(fn: Callable[[], tuple[Any, Any, dict]]) -> Callable[[], tuple[Any, Any, dict]]:
    def build() -> tuple[Any, Any, dict]:
        import torch

        from tests import torchvision_shim

        torchvision_shim.install_torchaudio()
        torch.manual_seed(0)
        model, example, axes = fn()
        return model.eval(), example, axes

    return build


def _randn(*shape: int) -> Any:
    return __import__("torch").randn(*shape)


T1 = {"x": {1: "T"}}
T2 = {"x": {2: "T"}}


def _torchaudio(name: str) -> Callable:
    def build() -> tuple[Any, Any, dict]:
        import torchaudio

        t, m = torchaudio.transforms, torchaudio.models
        return {
            "Spectrogram": lambda: (t.Spectrogram(), _randn(1, 16000), T1),
            "MelSpectrogram": lambda: (t.MelSpectrogram(16000, n_fft=400, hop_length=160, n_mels=80),
                                       _randn(1, 16000), T1),
            "MFCC": lambda: (t.MFCC(16000, n_mfcc=13, melkwargs={"n_fft": 400, "hop_length": 160, "n_mels": 40}),
                             _randn(1, 16000), T1),
            "ConvTasNet": lambda: (m.ConvTasNet(2, enc_kernel_size=16, enc_num_feats=64, msk_num_feats=32,
                                                msk_num_hidden_feats=64, msk_num_layers=2, msk_num_stacks=2),
                                   _randn(1, 1, 8000), T2),
            "Wav2Letter": lambda: (m.Wav2Letter(num_classes=10, input_type="waveform", num_features=1),
                                   _randn(1, 1, 16000), T2),
            "DeepSpeech": lambda: (m.DeepSpeech(n_feature=40, n_hidden=64, n_class=10), _randn(1, 1, 100, 40),
                                   T2),
            "HDemucs": lambda: (m.HDemucs(["drums", "bass"], audio_channels=1, channels=4, nfft=1024, depth=4),
                                _randn(1, 1, 8192), T2),
        }[name]()  # fmt: skip

    return _seeded(build)


def _speechbrain(name: str) -> Callable:
    def build() -> tuple[Any, Any, dict]:
        import torch
        from speechbrain.lobes import features
        from speechbrain.lobes.models.ECAPA_TDNN import ECAPA_TDNN

        if name == "ECAPA_TDNN":  # on 80 fbank features
            model = ECAPA_TDNN(80, lin_neurons=64, channels=[64, 64, 64, 64, 192], attention_channels=32)
            return model, _randn(1, 200, 80), T1
        model = {"Fbank": lambda: features.Fbank(n_mels=40), "MFCC": lambda: features.MFCC()}[name]()
        with torch.no_grad():  # its Deltas build their kernel on the first call
            model(_randn(1, 16000))
        return model, _randn(1, 16000), T1

    return _seeded(build)


def _asteroid(name: str) -> Callable:
    def build() -> tuple[Any, Any, dict]:
        import asteroid.models as m

        model = {
            "ConvTasNet": lambda: m.ConvTasNet(n_src=2, n_blocks=2, n_repeats=2, sample_rate=8000),
            "DPRNNTasNet": lambda: m.DPRNNTasNet(n_src=2, n_repeats=2, sample_rate=8000),
            "DCUNet": lambda: m.DCUNet("DCUNet-10", sample_rate=16000, fix_length_mode="pad"),
        }[name]()
        return model, _randn(1, 8000 if name != "DCUNet" else 16000), T1

    return _seeded(build)


def _whisper(name: str) -> Callable:
    def build() -> tuple[Any, Any, dict]:
        from tests.test_models_audio_frontends import OpenAIWhisperLogMel, _openai_whisper_audio

        if name == "log_mel_spectrogram":
            return OpenAIWhisperLogMel(), _randn(1, 16000), T1
        _openai_whisper_audio()
        import importlib
        import sys
        import types

        for part, names in (("decoding", ("decode", "detect_language")), ("transcribe", ("transcribe",))):
            stub = types.ModuleType(f"whisper.{part}")  # the decoder's imports (tiktoken) are not installed
            for attr in names:
                setattr(stub, attr, None)
            sys.modules.setdefault(f"whisper.{part}", stub)
        model = importlib.import_module("whisper.model")  # the bare package of _openai_whisper_audio
        return model.AudioEncoder(80, 1500, 64, 2, 2), _randn(1, 80, 3000), T2

    return _seeded(build)


def _silero() -> tuple[Any, Any, dict]:
    import torch

    spec = importlib.util.find_spec("silero_vad")
    if spec is None or spec.origin is None:
        raise RuntimeError("silero-vad is not installed")
    vad = torch.jit.load(str(Path(spec.origin).parent / "data" / "silero_vad.jit")).eval()
    # its 16 kHz network: 64 samples of context + 512 of audio, and the LSTM state
    return vad._model, (_randn(1, 576) * 0.1, torch.zeros(2, 1, 128)), {"in0": {1: "T"}}


PACKAGES: dict[str, Callable] = {
    **{f"torchaudio/{n}": _torchaudio(n) for n in
       ("Spectrogram", "MelSpectrogram", "MFCC", "ConvTasNet", "Wav2Letter", "DeepSpeech", "HDemucs")},
    **{f"speechbrain/{n}": _speechbrain(n) for n in ("Fbank", "MFCC", "ECAPA_TDNN")},
    **{f"asteroid/{n}": _asteroid(n) for n in ("ConvTasNet", "DPRNNTasNet", "DCUNet")},
    **{f"whisper/{n}": _whisper(n) for n in ("log_mel_spectrogram", "AudioEncoder")},
    "silero_vad/silero_vad.jit": _seeded(_silero),
}  # fmt: skip

"""Whisper's log-mel front end as its own graph (``export(..., frontend=True)``): raw 16 kHz
samples → the encoder's ``input_features``, as transformers' ``WhisperFeatureExtractor``
computes them for one utterance, so a tract user needs neither numpy's STFT nor transformers.

The graph is a small torch module over ``torch.stft`` (the pipeline lowers it as it lowers
openai-whisper's ``log_mel_spectrogram``); its input has the encoder's fixed length
(frames × hop: 480000 samples for 30 s), and the runner pads or trims the user's samples to it
with zeros as the extractor does (``fit_samples``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from torchlower.errors import InvalidArgumentError

PREPROCESSOR = "preprocessor_config.json"
INPUT, OUTPUT = "audio", "input_features"


class WhisperLogMel(nn.Module):
    """``WhisperFeatureExtractor._np_extract_fbank_features`` for one utterance of fixed
    length: centred reflect-padded STFT (periodic Hann), power, the extractor's mel filters,
    ``log10(max(x, 1e-10))``, the floor 8 below the utterance's maximum, ``(x + 4) / 4``."""

    def __init__(self, mel_filters: np.ndarray, n_fft: int, hop_length: int) -> None:
        super().__init__()
        self.n_fft, self.hop_length = n_fft, hop_length
        # the extractor's filters are [freq, mels]; the product wants [mels, freq]
        self.register_buffer("filters", torch.from_numpy(np.ascontiguousarray(mel_filters.T, np.float32)))
        self.register_buffer("window", torch.hann_window(n_fft))

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        stft = torch.stft(
            audio, self.n_fft, self.hop_length, window=self.window, center=True, pad_mode="reflect",
            return_complex=True,
        )  # fmt: skip
        power = stft[..., :-1].abs() ** 2  # the extractor drops the last frame
        log_spec = torch.clamp(self.filters @ power, min=1e-10).log10()
        log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
        return (log_spec + 4.0) / 4.0


@dataclass(frozen=True)
class FrontEnd:
    """The module and what the manifest records about it."""

    module: WhisperLogMel
    samples: int  # the graph's input length (the encoder's frames × hop)
    sampling_rate: int
    mels: int
    filters_from: str  # ``preprocessor_config.json`` or the config's ``num_mel_bins``

    def example(self, seed: int = 0) -> torch.Tensor:
        """A speech-like example: a few harmonics under an envelope, with noise, then silence."""
        return torch.from_numpy(speechlike(self.samples, self.sampling_rate, seed)[None])

    def manifest(self, archive: str) -> dict[str, Any]:
        return {
            "archive": archive,
            "inputs": {INPUT: [1, self.samples]},
            "outputs": [OUTPUT],
            "sampling_rate": self.sampling_rate,
            "samples": self.samples,
            "n_fft": self.module.n_fft,
            "hop_length": self.module.hop_length,
            "mel_filters": self.filters_from,
            # what ``generate(audio=...)`` does before the graph, as the extractor does
            "padding": "zeros at the end, or trimmed, to samples",
        }


def whisper_frontend(model: nn.Module, files: dict[str, bytes], frames: int) -> FrontEnd:
    """The front end of ``model``: the folder's ``preprocessor_config.json`` settings and mel
    filters when bundled, else ``WhisperFeatureExtractor``'s defaults with the config's
    ``num_mel_bins``; ``frames`` is the encoder's input length, which fixes the samples."""
    from transformers import WhisperFeatureExtractor

    mels = int(model.config.num_mel_bins)
    blob = files.get(PREPROCESSOR)
    if blob is not None:
        extractor = WhisperFeatureExtractor.from_dict(json.loads(blob))
        source = PREPROCESSOR
    else:
        extractor = WhisperFeatureExtractor(feature_size=mels)
        source = "config num_mel_bins (no preprocessor_config.json)"
    filters = np.asarray(extractor.mel_filters)
    if filters.shape[1] != mels:
        raise InvalidArgumentError(
            f"{PREPROCESSOR}: feature_size {filters.shape[1]} differs from the model's num_mel_bins"
            f" {mels}; fix the folder's preprocessor config"
        )
    module = WhisperLogMel(filters, int(extractor.n_fft), int(extractor.hop_length)).eval()
    return FrontEnd(module, frames * int(extractor.hop_length), int(extractor.sampling_rate), mels, source)


def fit_samples(audio: Any, samples: int, where: str) -> np.ndarray:
    """``audio`` ([n] or [1, n] float) as the graph's [1, samples] f32: zeros appended or
    trimmed, as ``WhisperFeatureExtractor`` pads and truncates one utterance."""
    array = np.asarray(audio.detach().cpu().numpy() if hasattr(audio, "detach") else audio)
    if array.ndim == 2 and array.shape[0] == 1:
        array = array[0]
    if array.ndim != 1 or array.dtype.kind != "f" or array.size == 0:
        raise InvalidArgumentError(
            f"{where}: audio= must be float samples [n] or [1, n] (one utterance at the manifest's"
            f" sampling_rate); got {array.dtype} {list(array.shape)}"
        )
    out = np.zeros((1, samples), np.float32)
    out[0, : min(samples, array.size)] = array[:samples]
    return out


def speechlike(samples: int, rate: int, seed: int) -> np.ndarray:
    """A real-looking utterance: a gliding pitch with harmonics under a syllable envelope and
    a little noise, over the first 60 % (the rest silence, as padded speech is)."""
    rng = np.random.default_rng(seed)
    n = int(samples * 0.6)
    t = np.arange(n) / rate
    pitch = 120 + 40 * np.sin(2 * np.pi * 0.7 * t) + 10 * seed
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    voice = sum(np.sin(k * phase) / k for k in range(1, 9))
    envelope = 0.5 * (1 - np.cos(2 * np.pi * 3.0 * t)) * np.exp(-t)
    signal = np.zeros(samples)
    signal[:n] = 0.3 * envelope * voice + 0.01 * rng.standard_normal(n)
    return signal.astype(np.float32)

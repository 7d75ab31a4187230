"""Running a speech encoder-decoder export (``seq2seq.py``) in tract: encode once, decode greedily.

The encoder runs once per utterance and gives every decoder layer's cross keys/values; each
decoder step feeds the new token ids, the self-attention cache (tract state when tract's
``detect_kv_cache`` recognizes every cache, else explicit tensors) and the cross keys/values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from torchlower.errors import InvalidArgumentError
from torchlower.llm.context import ContextLengthError
from torchlower.llm.manifest import part_path, tract_load
from torchlower.llm.manifest import read_manifest as read_format_manifest
from torchlower.llm.seq2seq_frontend import fit_samples

MANIFEST = "manifest.json"
FORMAT = "torchlower.speech_seq2seq"
ENCODER_DECODER = ("encoder", "decoder")


def is_seq2seq(path: Path) -> bool:
    return path.is_dir() and (path / MANIFEST).is_file() and not (path / "graph.nnef").exists()


def read_manifest(folder: Path) -> dict[str, Any]:
    return read_format_manifest(folder, FORMAT)


class Seq2SeqRunner:
    """The encoder and decoder archives of ``folder`` loaded in tract."""

    def __init__(self, folder: str | Path, kv: str = "auto") -> None:
        import tract

        self.folder = Path(folder)
        self.manifest = read_manifest(self.folder)
        nnef = tract.nnef().with_tract_extra().with_tract_transformers()
        encoder_path, decoder_path = (
            part_path(self.folder, self.manifest, p) for p in ("encoder", "decoder")
        )
        self.encoder = tract_load(nnef, encoder_path).into_runnable()
        self.frontend = None  # ``export(frontend=True)``: raw samples → input_features
        if "frontend" in self.manifest:
            frontend_path = part_path(self.folder, self.manifest, "frontend")
            self.frontend = tract_load(nnef, frontend_path).into_runnable()
        self.n_cache = (
            len(self.manifest["decoder"]["inputs"]) - 1 - len(self.manifest["decoder"]["cross_inputs"])
        )
        self.max_context = int(self.manifest["max_context"])
        self.vocab = int(self.manifest["vocab_size"])
        model = tract_load(nnef, decoder_path)
        self.cache_facts = [str(model.input_fact(i)) for i in range(1, 1 + self.n_cache)]
        self.mode = "explicit"
        if kv in ("auto", "state"):
            stateful = tract_load(nnef, decoder_path)
            stateful.transform("detect_kv_cache")
            if stateful.input_count() == model.input_count() - self.n_cache:
                model, self.mode = stateful, "state"
            elif kv == "state":
                raise InvalidArgumentError(
                    f"{decoder_path}: tract's detect_kv_cache did not take every cache"
                )
        self.decoder = model.into_runnable()
        self.cross: list[Any] = []  # tract tensors
        self.reset()

    def reset(self) -> None:
        self.state = self.decoder.spawn_state()
        dims = [[int(d) if d.strip().isdigit() else 0 for d in f.split(",")[:-1]] for f in self.cache_facts]
        self.past = [np.zeros(d, dtype=np.float32) for d in dims]
        self.length = 0

    def encode(self, input_features: Any) -> None:
        """Run the encoder on ``input_features`` (Whisper [1, mels, 3000]; Speech2Text [1, T,
        features]; Moonshine's audio [1, samples]; T and samples in the manifest's ``frames``
        bounds) and start a fresh decode."""
        want = list(next(iter(self.manifest["encoder"]["inputs"].values())))  # one input
        frames = self.manifest["encoder"].get("frames", {})
        array = np.asarray(
            input_features.detach().cpu().numpy() if hasattr(input_features, "detach") else input_features
        )
        if array.ndim == len(want) - 1:  # without the batch axis
            array = array[None]
        axis = int(frames.get("axis", len(want) - 1))
        low, high = int(frames.get("min", want[axis])), int(frames.get("max", want[axis]))
        fits = array.ndim == len(want) and all(
            low <= n <= high if i == axis else n == want[i] for i, n in enumerate(array.shape)
        )
        if not fits or array.dtype.kind != "f":
            shape = ", ".join(
                f"{low}..{high}" if i == axis and low != high else str(n) for i, n in enumerate(want)
            )
            raise InvalidArgumentError(
                f"input_features must be float [{shape}] ({'audio samples' if len(want) == 2 else 'log-mel'}"
                f" frames, padded as the model's feature extractor pads them); got {array.dtype}"
                f" {list(array.shape)}"
            )
        # kept as tract tensors: fed every step without a copy through numpy (22 of 63 ms/token
        # for whisper-tiny's 8 cross tensors of [1, 6, 1500, 64])
        self.cross = list(self.encoder.run([np.ascontiguousarray(array, np.float32)]))
        self.reset()

    def features(self, audio: Any) -> np.ndarray:
        """The encoder's ``input_features`` of raw ``audio`` samples ([n] or [1, n] at the
        manifest's sampling rate), padded or trimmed as the feature extractor does, by the
        bundled front end; ``InvalidArgumentError`` when the export has none."""
        if self.frontend is None:
            raise InvalidArgumentError(
                f"{self.folder}: audio= needs the log-mel front end bundled; export with"
                " frontend=True (torchlower llm export --frontend), or pass input_features="
            )
        samples = int(self.manifest["frontend"]["samples"])
        return self.frontend.run([fit_samples(audio, samples, str(self.folder))])[0].to_numpy()

    def refuse_past_context(self, needed: int) -> None:
        """``ContextLengthError`` if ``needed`` decoder positions do not fit the archive's bound."""
        if needed > self.max_context:
            raise ContextLengthError(
                f"{self.folder}: {needed} positions (start tokens and generated tokens fed back) exceed"
                f" the decoder's P + S <= {self.max_context} (its position table)",
                max_context=self.max_context,
                needed=needed,
            )

    def step(self, ids: np.ndarray) -> np.ndarray:
        """Logits of the last position after feeding ``ids`` [1, S]."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(1, -1)
        if ids.min() < 0 or ids.max() >= self.vocab:
            raise InvalidArgumentError(f"token ids must be in 0..{self.vocab - 1}; got {int(ids.max())}")
        self.refuse_past_context(self.length + ids.shape[1])
        self.length += ids.shape[1]
        if self.mode == "state":
            out = self.state.run([ids, *self.cross])
            return out[0].to_numpy()[0, -1]
        out = self.state.run([ids, *self.past, *self.cross])
        self.past = [t.to_numpy() for t in out[1:]]
        return out[0].to_numpy()[0, -1]

    def greedy(
        self,
        start: list[int],
        steps: int,
        input_features: Any,
        stops: set[int] | None = None,
        processors: bool = False,
    ) -> tuple[list[int], list[np.ndarray]]:
        """Arg-max tokens after ``start`` and the (raw) logits that chose each. With
        ``processors``, the manifest's ``generation`` suppressions apply as HF's Whisper
        ``generate`` applies them (``suppress_tokens`` every step, ``begin_suppress_tokens`` at
        the first generated position)."""
        gen = self.manifest.get("generation", {}) if processors else {}
        always = np.array(gen.get("suppress_tokens", []), dtype=np.int64)
        begin = np.array(gen.get("begin_suppress_tokens", []), dtype=np.int64)
        self.encode(input_features)
        tokens: list[int] = []
        logits: list[np.ndarray] = []
        feed = np.array([start], dtype=np.int64)
        for i in range(steps):
            row = self.step(feed)
            logits.append(row)
            scores = row.copy()
            scores[always[always < scores.size]] = -np.inf
            if i == 0:
                scores[begin[begin < scores.size]] = -np.inf
            tokens.append(int(np.argmax(scores)))
            if stops and tokens[-1] in stops:
                break
            feed = np.array([[tokens[-1]]], dtype=np.int64)
        return tokens, logits

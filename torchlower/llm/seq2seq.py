"""``torchlower.llm.export`` of a speech encoder-decoder (Whisper, Speech2Text, Moonshine): a
folder of two archives.

``OUT/encoder.nnef.tgz`` maps the encoder's input (``input_features``; Moonshine's audio
``input_values``) to every decoder layer's cross-attention keys
and values (computed once per utterance; Speech2Text's and Moonshine's with a dynamic time
axis, lowered by the jit front end); ``OUT/decoder.nnef.tgz`` is one decoder step with the
self-attention KV cache in tract's naming and the cross keys/values as inputs
(``seq2seq_parts.py``); ``OUT/manifest.json`` says how they connect. Each part is lowered and
checked by the pipeline's stages (export front end, passes, staged write, tract vs the part at
several sizes); then the two run together in tract (``seq2seq_runner.py``) against Hugging
Face's ``…ForConditionalGeneration``: greedy tokens and the logits of every step. A failed
check writes nothing.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from torchlower import __version__
from torchlower.core import progress
from torchlower.core.staging import staged
from torchlower.errors import InvalidArgumentError
from torchlower.llm import seq2seq_frontend
from torchlower.llm.part_export import dequantized_model, export_part, folder_target, judge_decoding, naming
from torchlower.llm.seq2seq_families import context_limit, layout_of, parts
from torchlower.llm.seq2seq_frontend import FrontEnd
from torchlower.llm.seq2seq_head import table_names, untie_head
from torchlower.llm.seq2seq_parts import Seq2SeqLayout
from torchlower.pipeline import report

MANIFEST = "manifest.json"
FORMAT = "torchlower.speech_seq2seq"
ENCODER, DECODER = "encoder.nnef.tgz", "decoder.nnef.tgz"
FRONTEND = "frontend.nnef.tgz"  # ``frontend=True``: raw samples → log-mel (seq2seq_frontend.py)
# model_type → the class its config names (what ``open_speech_seq2seq`` loads)
ARCHITECTURES = {
    "whisper": "WhisperForConditionalGeneration",
    "speech_to_text": "Speech2TextForConditionalGeneration",
    "moonshine": "MoonshineForConditionalGeneration",
}
CHECK_TOKENS = 8  # greedy steps the export runs against HF


@dataclass
class Seq2SeqReport:
    """What was written and how far tract is from Hugging Face (parts and end to end)."""

    path: Path
    model_type: str
    architecture: str
    parameters: int
    layers: int
    max_context: int
    precision: str
    compress: str | None
    encoder: report.ExportReport
    decoder: report.ExportReport
    archive_bytes: int
    frontend: report.ExportReport | None = None  # ``frontend=True``: the log-mel graph
    seconds: float = 0.0
    bundled: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # tract's greedy tokens in the check
    reference_tokens: list[int] = field(default_factory=list)  # HF's
    logit_error: float = float("nan")  # max |HF − tract| over the logits of every checked step

    @property
    def errors(self) -> list[Any]:
        extra = self.frontend.errors if self.frontend is not None else []
        return [*extra, *self.encoder.errors, *self.decoder.errors]


def is_speech_seq2seq(config: Any) -> bool:
    names = [str(a) for a in (getattr(config, "architectures", None) or [])]
    return ARCHITECTURES.get(str(getattr(config, "model_type", None))) in names


def export(
    model: nn.Module,
    files: dict[str, bytes],
    path: str | os.PathLike[str],
    *,
    precision: str = "f32",
    compress: str | None = None,
    max_context: int | None = None,
    check: bool = True,
    io_samples: bool = False,
    frontend: bool = False,
) -> Seq2SeqReport:
    """Write ``path`` (a folder) with the encoder and decoder archives and their manifest;
    ``io_samples`` bundles each part's example and outputs (``io/example.npz``); ``frontend``
    (Whisper) adds the log-mel front end as ``frontend.nnef.tgz``, raw samples → the encoder's
    ``input_features`` (``generate(..., audio=...)``), in f32 whatever ``precision``."""
    started = time.perf_counter()
    target = folder_target(path, "a speech encoder-decoder")
    model = model.eval()
    layout = layout_of(model)
    limit, table = context_limit(model)
    context = max_context or limit
    if context > limit:
        raise InvalidArgumentError(
            f"max_context={max_context} exceeds the decoder's {limit} positions (max_target_positions,"
            f" {table}); pass max_context <= {limit}"
        )
    props = _properties(model, layout, context, precision, compress)
    front = _frontend(model, files, layout) if frontend else None
    encoder, decoder = parts(model, layout)
    aliases = untie_head(decoder, model) if compress == "q4_0" else {}  # the head packs apart
    with staged(target) as folder, naming(folder, target):
        folder.mkdir()
        front_report = None
        if front is not None:
            with progress.stage("front end"):  # f32: log10 of a 1e-10 floor is not f16's
                front_report, _ = export_part(
                    front.module, (front.example(),), folder / FRONTEND, [seq2seq_frontend.INPUT],
                    [seq2seq_frontend.OUTPUT], None, "f32", None, check, [],
                    props | {"torchlower.llm.part": "frontend"}, {}, io_samples=io_samples,
                )  # fmt: skip
        with progress.stage("encoder"):
            # a dynamic time axis goes through the jit front end (torch.export specializes the
            # convolutions' lengths and the position table's size tests)
            enc, enc_weights = export_part(
                encoder, (_features(layout),), folder / ENCODER, [layout.input_name],
                layout.encoder_outputs(), _encoder_axes(layout), precision, compress, check, [],
                props | {"torchlower.llm.part": "encoder"}, {}, "jit" if layout.dynamic else "export",
                io_samples=io_samples,
            )  # fmt: skip
        with progress.stage("decoder"):
            dec, dec_weights = export_part(
                decoder, _decoder_example(layout), folder / DECODER,
                layout.decoder_inputs(), layout.decoder_outputs(), _decoder_axes(layout, context), precision,
                compress, check, _bounds(context), props | {"torchlower.llm.part": "decoder"}, files,
                keep_float=table_names(decoder, model), io_samples=io_samples,
            )  # fmt: skip
        manifest = _manifest(model, layout, context, precision, compress)
        if front is not None:
            manifest["frontend"] = front.manifest(FRONTEND)
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
        result = Seq2SeqReport(
            folder, str(model.config.model_type), type(model).__name__,
            sum(p.numel() for p in model.parameters()), layout.layers, context, precision, compress,
            enc, dec, 0, frontend=front_report, bundled=sorted(files),
        )  # fmt: skip
        if check:
            reference_model = dequantized_model(
                model, (encoder, enc_weights), (decoder, dec_weights), aliases=aliases
            )
            with progress.stage("checking against Hugging Face"):
                _check_end_to_end(result, model, reference_model, layout, precision)
        result.archive_bytes = sum(f.stat().st_size for f in folder.iterdir())
    result.path = target
    result.encoder.path, result.decoder.path = target / ENCODER, target / DECODER
    if result.frontend is not None:
        result.frontend.path = target / FRONTEND
    result.seconds = time.perf_counter() - started
    return result


def _check_end_to_end(
    result: Seq2SeqReport, model: nn.Module, reference_model: nn.Module, layout: Seq2SeqLayout, precision: str
) -> None:
    """Greedy tokens and every step's logits of tract (encoder once, decoder step by step) vs HF
    running the weights the archive holds (q4_0: dequantized), both decoding with their caches
    as ``generate`` does. f16 is reported, not bounded: the reference runs in f32 and a tiny
    random model's greedy chain may flip on an f16 step."""
    from torchlower.llm.seq2seq_runner import Seq2SeqRunner

    features = _features(layout, seed=1)
    start = [int(model.config.decoder_start_token_id or 0)]
    steps = min(CHECK_TOKENS, result.max_context - len(start))
    tokens, logits = Seq2SeqRunner(result.path).greedy(start, steps, features.numpy())

    def hf(kind: str, forced: list[int] | None) -> tuple[list[int], np.ndarray]:
        chosen = reference_model if kind == "reference" else model
        return hf_decode(chosen, features, start, steps, forced=forced)

    judge_decoding(result, "encoder + decoder", tokens, logits, hf, reference_model is model, precision)


def hf_decode(
    model: nn.Module, features: torch.Tensor, start: list[int], steps: int, forced: list[int] | None = None
) -> tuple[list[int], np.ndarray]:
    """HF's own cached decoding (what ``generate`` does without logits processors): the arg-max
    tokens and each step's logits [steps, vocab]; ``forced`` feeds those tokens instead (the
    logits HF gives for tract's chain)."""
    from torchlower.llm.wrapper import cache_arg, present_cache

    tokens: list[int] = []
    rows: list[np.ndarray] = []
    with torch.no_grad():
        encoded = model.get_encoder()(features)
        feed, cache = torch.tensor([start]), None
        for i in range(steps):
            out = model(
                encoder_outputs=encoded, decoder_input_ids=feed, use_cache=True, **{cache_arg(model): cache}
            )
            cache = present_cache(out)
            rows.append(out.logits[0, -1].float().numpy())
            tokens.append(int(out.logits[0, -1].argmax()) if forced is None else forced[i])
            feed = torch.tensor([[tokens[-1]]])
    return tokens, np.stack(rows)


def _frontend(model: nn.Module, files: dict[str, bytes], layout: Seq2SeqLayout) -> FrontEnd:
    if str(model.config.model_type) != "whisper":
        raise InvalidArgumentError(
            f"frontend=True (--frontend) bundles Whisper's log-mel front end; {type(model).__name__}"
            " takes its features from its own extractor: export without it"
        )
    return seq2seq_frontend.whisper_frontend(model, files, int(layout.frames))


def _features(layout: Seq2SeqLayout, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*map(int, layout.features_shape()), generator=g)


def _decoder_example(layout: Seq2SeqLayout) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, layout.vocab, (1, 3), generator=g)
    past = [torch.randn(t.shape, generator=g) for t in layout.empty_cache(5)]
    cross = [torch.randn(1, layout.heads, layout.source, layout.head_dim, generator=g) for _ in past]
    return (ids, *past, *cross)


def _encoder_axes(layout: Seq2SeqLayout) -> dict[str, Any] | None:
    if not layout.dynamic:
        return None
    return {layout.input_name: {layout.time_axis: ("T", layout.min_frames, layout.max_frames)}}


def _decoder_axes(layout: Seq2SeqLayout, context: int) -> dict[str, Any]:
    cache = [f"in_cache_{t}_{i}" for i in range(layout.layers) for t in ("key", "value")]
    axes = {"input_ids": {1: ("S", 1, context)}} | {n: {2: ("P", 1, context)} for n in cache}
    if layout.dynamic:  # the encoder's positions: any length its time axis gives
        axes |= {n: {2: ("F", 1, layout.max_source)} for n in layout.encoder_outputs()}
    return axes


def _bounds(context: int) -> list[str]:
    return [f"tract_assert P + S <= {context}", "tract_assert S >= 1", "tract_assert P >= 0"]


def _properties(
    model: nn.Module, layout: Seq2SeqLayout, context: int, precision: str, compress: str | None
) -> dict[str, str | int | float]:
    return {
        "torchlower.version": __version__,
        "torchlower.llm.model_type": str(model.config.model_type),
        "torchlower.llm.architecture": type(model).__name__,
        "torchlower.llm.layers": layout.layers,
        "torchlower.llm.max_context": context,
        "torchlower.llm.precision": precision,
        "torchlower.llm.compress": compress or "none",
    }


def _generation(model: nn.Module) -> dict[str, Any]:
    """What ``generate`` applies as HF's Whisper ``generate`` does: suppressed tokens (every
    step), tokens suppressed at the first generated position, the end-of-text id."""
    gen = getattr(model, "generation_config", None)

    def ids(value: Any) -> list[int]:
        return [int(v) for v in (value or [])]

    eos = getattr(gen, "eos_token_id", None)
    return {
        "suppress_tokens": ids(getattr(gen, "suppress_tokens", None)),
        "begin_suppress_tokens": ids(getattr(gen, "begin_suppress_tokens", None)),
        "eos_token_id": ids([eos] if isinstance(eos, int) else eos),
    }


def _manifest(
    model: nn.Module, layout: Seq2SeqLayout, context: int, precision: str, compress: str | None
) -> dict[str, Any]:
    """How the archives connect (docs/llm.md): the encoder's outputs are the decoder's cross inputs."""
    config = model.config
    return {
        "format": FORMAT,
        "version": 1,
        "model_type": str(config.model_type),
        "architecture": type(model).__name__,
        "encoder": {
            "archive": ENCODER,
            "inputs": {layout.input_name: layout.features_shape("T" if layout.dynamic else None)},
            "outputs": layout.encoder_outputs(),
            # the input's time axis and the frames (samples) it takes (Whisper: one fixed length)
            "frames": {
                "axis": layout.time_axis,
                "min": layout.min_frames or layout.frames,
                "max": layout.max_frames or layout.frames,
            },
        },
        "decoder": {
            "archive": DECODER,
            "inputs": layout.decoder_inputs(),
            "outputs": layout.decoder_outputs(),
            "cross_inputs": layout.encoder_outputs(),
        },
        "max_context": context,
        "generation": _generation(model),
        "decoder_start_token_id": config.decoder_start_token_id,
        "eos_token_id": config.eos_token_id,
        "vocab_size": layout.vocab,
        "precision": precision,
        "compress": compress or "none",
    }

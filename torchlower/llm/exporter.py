"""``torchlower.llm.export``: a Hugging Face causal LM → an NNEF archive tract decodes with a KV cache.

Built on the ``export`` front end of ``torchlower.export`` (same builder, passes, guards and
atomic writer); this module adds what an LLM needs around it: the cache I/O convention
(``wrapper.py``), symbol bounds, provenance, bundled files, and a check against the model as
Hugging Face runs it on more than one input (prefill from an empty cache, a continuation
with past, one decode step).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from torchlower import __version__
from torchlower.core import progress
from torchlower.core import tolerance as tolerances
from torchlower.core.comparison import OutputError
from torchlower.core.staging import target_of
from torchlower.errors import InvalidArgumentError
from torchlower.llm import bundle, checks, ssm_checks, stages, vlm_families
from torchlower.llm import lora as lora_mod
from torchlower.llm.precision import DEFAULT_F32_PARTS, F32_PARTS, cache_dtype, conversion_notes
from torchlower.llm.source import SourceError, WrongModelError, open_named, open_speech_seq2seq
from torchlower.llm.ssm import StateLayout
from torchlower.llm.wrapper import (
    CacheLayout,
    attributes_kept,
    rope_switch_length,
)
from torchlower.nnef import archive
from torchlower.pipeline import write

if TYPE_CHECKING:
    from torchlower.llm.seq2seq import Seq2SeqReport
    from torchlower.llm.vlm import MultimodalReport

log = logging.getLogger("torchlower")

PRECISIONS = ("f32", "f16")
COMPRESSIONS = (None, "q4_0")
EMBEDDINGS = (None, "f32", "f16", "q4_0")
LOGITS = ("last", "all", "keep")
# tract's scenarios (data/src/dim/sym.rs): ``tg`` one-token decode, ``pp`` prefill from an empty
# cache, the names of tract's own LLM bench; tract simplifies a shape by them where both agree
SCENARIOS = ["tract_assert tg: S == 1", "tract_assert pp: P == 0"]
# torch itself running these models in f16 differs from f32 by up to ~3 % of the largest logit
# (docs/llm.md); the f16 check allows that much, 3x the generic f16 tolerance
F16_TOLERANCE = 3e-2


@dataclass
class ExportReport:
    """What was written, from what, and how far tract is from Hugging Face on the checked inputs."""

    path: Path
    model_type: str
    parameters: int
    layers: int
    max_context: int
    precision: str
    compress: str | None
    embeddings: str  # storage of the token embedding table
    lm_head: str  # storage of the LM head
    logits: str
    weight_bytes: int
    weight_bytes_by_format: dict[str, int]
    archive_bytes: int
    seconds: float
    bundled: list[str]
    errors: list[OutputError] = field(default_factory=list)  # vs the checked reference
    original_errors: list[OutputError] = field(default_factory=list)  # with compress: vs the original
    properties: dict[str, str | int | float] = field(default_factory=dict)
    # weights Q4_0 was asked for that stayed float (HF name → why), e.g. a size not a multiple of 32
    unquantized: dict[str, str] = field(default_factory=dict)
    part: str | None = None  # ``part=`` of export: the part of a larger checkpoint written on purpose
    # checkpoint tensors the export leaves out (only with ``part``: otherwise refused)
    unused_weights: list[str] = field(default_factory=list)
    # conversions of the checkpoint's weights (a bfloat16 checkpoint exported as f32 or f16)
    notes: list[str] = field(default_factory=list)
    # a state-space model's fixed-size states, carried as explicit graph inputs/outputs
    states: list[str] = field(default_factory=list)

    @property
    def max_abs_error(self) -> float:
        return max((e.max_abs for e in self.errors), default=0.0)

    @property
    def logit_error(self) -> float:
        """max |HF − tract| over the logits of every checked input (original model for q4_0)."""
        errors = self.original_errors or self.errors
        return max((e.max_abs for e in errors if e.name.startswith("outputs")), default=0.0)


def export(
    source: str | os.PathLike[str] | nn.Module,
    path: str | os.PathLike[str],
    *,
    precision: str = "f32",
    compress: str | None = None,
    embeddings: str | None = None,
    lm_head: str | None = None,
    logits: str = "last",
    max_context: int | None = None,
    check: bool = True,
    io_samples: bool = False,
    f32_parts: tuple[str, ...] | None = None,
    part: str | None = None,
    lora: str | os.PathLike[str] | None = None,
    merge_lora: bool = False,
    frontend: bool = False,
) -> ExportReport | Seq2SeqReport | MultimodalReport:
    """Export a causal LM (a ``save_pretrained`` folder or a loaded model) for tract; a
    ``WhisperForConditionalGeneration`` (or Speech2Text's, Moonshine's) becomes a folder of two
    archives (``seq2seq.export``, a ``Seq2SeqReport``); a vision or audio LM (LLaVA, Idefics3,
    SmolVLM, Qwen2-VL, Qwen2.5-VL, Qwen2-Audio) a folder of three and a manifest (``vlm.export``, a
    ``MultimodalReport``).

    Graph inputs ``input_ids`` [1, S] and per layer ``in_cache_key_{i}``/``in_cache_value_{i}``
    [1, kv_heads, P, head_dim]; outputs ``outputs`` (logits: [1, 1, vocab] with
    ``logits="last"``, [1, S, vocab] with ``"all"``, [1, K, vocab] with ``"keep"``: a last input
    ``logits_to_keep`` i64 [K] names the positions among the S new ones) and ``out_cache_key_{i}``/
    ``out_cache_value_{i}`` [1, kv_heads, P+S, head_dim], with ``P + S <= max_context``.
    ``compress="q4_0"`` stores the linear layers in 4-bit blocks. ``embeddings`` picks the
    storage of the token embedding table (default f32) and ``lm_head`` that of the LM head
    (default: q4_0 with ``compress="q4_0"``, as the reference exporter's ``min_max_q4_0``
    does, else the ``embeddings`` choice); each of ``f32``, ``f16``, ``q4_0``.
    ``f32_parts`` (f16 only): parts computed in f32 inside the f16 graph, any of
    ``"attention"``, ``"norms"``, ``"lm_head"``; default ``("attention", "norms")``, ``()`` for
    f16 throughout (``precision.keep_f32``).
    ``check`` compares with the model as Hugging Face runs it; a failed export writes nothing.
    A folder is exported whole or not at all (``WrongModelError``: its config names another
    class than the causal LM transformers loads, or checkpoint weights would stay unused) unless
    ``part="decoder"`` asks for the decoder alone (e.g. Whisper's, without cross-attention).
    The context bound is the smallest of the config's position field and the rows of the
    model's learned position tables.
    ``lora``: a peft LoRA adapter folder applied to the base (``llm/lora.py``): merged into the
    weights with ``merge_lora=True``, else kept as separate A/B tensors computed in the graph.
    ``frontend`` (Whisper): also the log-mel front end as its own graph, raw 16 kHz samples → the
    encoder's ``input_features`` as ``WhisperFeatureExtractor`` computes them (``seq2seq_frontend``).
    """
    started = time.perf_counter()
    _validate_options(precision, compress, embeddings, lm_head, logits, max_context, check, io_samples)
    adapter = lora_mod.from_option(source, lora, merge_lora)
    speech = open_speech_seq2seq(source) if part is None else None
    if speech is not None:  # an encoder-decoder: a folder of two archives (seq2seq.py)
        _refuse_causal_options(embeddings, lm_head, logits, f32_parts, lora)
        from torchlower.llm import seq2seq

        return seq2seq.export(
            speech[0], speech[1], path, precision=precision, compress=compress, max_context=max_context,
            check=check, io_samples=io_samples, frontend=frontend,
        )  # fmt: skip
    if frontend:
        raise InvalidArgumentError(
            f"{source}: frontend=True (--frontend) bundles Whisper's log-mel front end; this is not a"
            " WhisperForConditionalGeneration folder: export without it"
        )
    multimodal = open_named(source, vlm_families.ARCHITECTURES, mapped=True) if part is None else None
    if multimodal is not None:  # a vision/audio LM: a folder of three archives (vlm.py)
        _refuse_causal_options(embeddings, lm_head, logits, f32_parts, lora, "a multimodal LM")
        from torchlower.llm import vlm

        return vlm.export(
            multimodal[0], multimodal[1], path, precision=precision, compress=compress,
            max_context=max_context, check=check, io_samples=io_samples, mapping=multimodal[2],
        )  # fmt: skip
    storage = table_storage(compress, embeddings, lm_head)
    parts = _f32_parts(precision, f32_parts)
    target = Path(path)
    archive.archive_kind(target)  # a bad suffix fails before the model loads
    loaded = stages.load(source, max_context, part)
    with lora_mod.applied(loaded.model, adapter, merge_lora):
        return _export_loaded(
            loaded, target, started, precision=precision, compress=compress, storage=storage, logits=logits,
            check=check, io_samples=io_samples, parts=parts, adapter=adapter, merge_lora=merge_lora,
        )  # fmt: skip


def _export_loaded(
    loaded: stages.Loaded,
    target: Path,
    started: float,
    *,
    precision: str,
    compress: str | None,
    storage: dict[str, str],
    logits: str,
    check: bool,
    io_samples: bool,
    parts: tuple[str, ...],
    adapter: lora_mod.Adapter | None,
    merge_lora: bool,
) -> ExportReport:
    """Trace, store, optimize, write and check the loaded model (its LoRA adapter applied)."""
    captured = stages.capture(loaded, logits, precision)
    keep = check or io_samples  # the dequantized weights are needed to check or to sample
    dequantized, left_float = stages.store_tables(loaded, captured, compress, storage, precision, keep)
    stages.optimize(loaded, captured, precision, logits, parts)
    builder, weights = captured.builder, captured.builder.live_weights()
    props = _properties(loaded, precision, compress, storage, logits, parts)
    if adapter is not None:
        props |= lora_mod.properties(adapter, merge_lora)
    bounds = _bounds(loaded)
    graph = bundle.with_header(builder.graph_text(), bounds, bundle.properties_fragment(props))
    files = dict(loaded.src.files)
    if adapter is not None and not merge_lora:  # the adapter's own config, for a later swap
        files[lora_mod.CONFIG_FILE] = adapter.config_bytes
    if io_samples:
        sampler = ssm_checks.samples if isinstance(loaded.layout, StateLayout) else checks.samples
        files |= sampler(
            loaded.model, loaded.layout, loaded.vocab, logits, dequantized, cache_dtype(precision)
        )
    release = loaded.src.mapping.release if loaded.src.mapping is not None else None
    with write.staging(target, check=True) as staging:  # renamed after the check: a failure writes nothing
        staged = archive.write(
            staging, graph, weights, builder.quant_text(), files, release, huffman_only=True
        )
        options = dict(precision=precision, compress=compress, logits=logits, **storage)
        report = _report(staged, loaded, props, options, weights, files, left_float)
        if check:
            with progress.stage("checking in tract"), attributes_kept(loaded.model):
                _check(report, loaded.model, loaded.layout, loaded.vocab, logits, precision, dequantized)
    report.path = target
    report.seconds = time.perf_counter() - started
    return report


def _bounds(loaded: stages.Loaded) -> list[str]:
    """The symbols' bounds: P + S within the context; a state-space model has no P and its
    states do not grow, so only the tokens of one call are bounded (and tract's prefill/decode
    scenarios, which name P, are left out)."""
    if isinstance(loaded.layout, StateLayout) and not loaded.layout.has_kv:
        return ["tract_assert S >= 1"]  # the builder writes S's upper bound
    bounds = [f"tract_assert P + S <= {loaded.context}", "tract_assert S >= 1", "tract_assert P >= 0"]
    return bounds + SCENARIOS


def _properties(
    loaded: stages.Loaded,
    precision: str,
    compress: str | None,
    storage: dict[str, str],
    logits: str,
    parts: tuple[str, ...],
) -> dict[str, str | int | float]:
    """The provenance the archive carries (``torchlower.llm.*`` properties)."""
    model = loaded.model
    # a state-space model without attention has no position limit: its states do not grow
    states = isinstance(loaded.layout, StateLayout) and not loaded.layout.has_kv
    props: dict[str, str | int | float] = {
        "torchlower.version": __version__,
        "torchlower.llm.model_type": loaded.src.model_type,
        "torchlower.llm.architecture": type(model).__name__,
        "torchlower.llm.parameters": sum(p.numel() for p in model.parameters()),
        "torchlower.llm.layers": loaded.layout.layers,
        **({} if states else {"torchlower.llm.max_context": loaded.context}),
        "torchlower.llm.precision": precision,
        "torchlower.llm.compress": compress or "none",
        "torchlower.llm.embeddings": storage["embeddings"],
        "torchlower.llm.lm_head": storage["lm_head"],
        "torchlower.llm.logits": logits,
    }
    if isinstance(loaded.layout, StateLayout):  # fixed-size states, explicit I/O
        props["torchlower.llm.states"] = ",".join(loaded.layout.state_names("in"))
    if states:
        props["torchlower.llm.max_tokens_per_call"] = loaded.context
    switch = rope_switch_length(loaded.config, loaded.context)
    if switch is not None:
        props["torchlower.llm.recompute_cache_at"] = switch
    if precision == "f16":
        props["torchlower.llm.f32_parts"] = ",".join(parts) or "none"
    if loaded.src.part is not None:
        props["torchlower.llm.part"] = loaded.src.part
        props["torchlower.llm.unused_weights"] = len(loaded.src.unused)
    return props


def _report(
    staged: Path,
    loaded: stages.Loaded,
    props: dict[str, str | int | float],
    options: dict[str, Any],
    weights: dict[str, Any],
    files: dict[str, bytes],
    left_float: dict[str, str],
) -> ExportReport:
    """The report of the written archive; ``options`` are export's precision, compress, logits
    and the two table storages."""
    return ExportReport(
        path=staged,
        model_type=loaded.src.model_type,
        parameters=int(props["torchlower.llm.parameters"]),
        layers=loaded.layout.layers,
        max_context=loaded.context,
        **options,
        weight_bytes=write.weight_bytes(weights),
        weight_bytes_by_format=write.bytes_by_format(weights),
        archive_bytes=_size_on_disk(staged),
        seconds=0.0,
        bundled=sorted(files),
        properties=props,
        unquantized=left_float,
        part=loaded.src.part,
        unused_weights=list(loaded.src.unused),
        notes=conversion_notes(loaded.src.stored_dtypes, str(options["precision"]), loaded.model),
        states=loaded.layout.state_names("in") if isinstance(loaded.layout, StateLayout) else [],
    )


def _check(
    report: ExportReport,
    model: nn.Module,
    layout: CacheLayout | StateLayout,
    vocab: int,
    logits: str,
    precision: str,
    dequantized: dict[str, torch.Tensor] | None,
) -> None:
    """Three inputs against HF: prefill (P = 0), a continuation with past, one decode step.

    With compressed weights the same inputs also run against the original model (reported, not
    bounded). One tract load for all of them (the archive is loaded once by the check worker).
    """
    from torchlower.core.comparison import compare
    from torchlower.errors import CheckError
    from torchlower.nnef.tract import run_points_in_tract

    dtype = cache_dtype(precision)
    long = _long_prefill(report)
    if isinstance(layout, StateLayout):
        reference = ssm_checks.reference_cases(model, layout, vocab, logits, dequantized, dtype=dtype)
        original = (
            []
            if dequantized is None
            else ssm_checks.reference_cases(model, layout, vocab, logits, dtype=dtype)
        )
    else:
        reference = checks.reference_cases(
            model, layout, vocab, logits, dequantized, dtype=dtype, long_prefill=long
        )
        original = (
            []
            if dequantized is None
            else checks.reference_cases(model, layout, vocab, logits, None, dtype=dtype, long_prefill=long)
        )
    points = [[t.numpy() for t in case.inputs] for case in reference + original]
    got = run_points_in_tract(report.path, points)
    for case, actual in zip(reference, got[: len(reference)], strict=True):
        want = [t.numpy() for t in case.outputs]
        tol = (
            F16_TOLERANCE * tolerances.output_scale(want) if precision == "f16" else tolerances.default(want)
        )
        if dequantized is not None:
            tol = max(tol, 1e-3 * tolerances.output_scale(want))  # blocks reorder the f32 sums
        names = [f"{n} ({case.label})" for n in layout.output_names()]
        report.errors += compare(names, want, actual, tol)
    bad = [e for e in report.errors if not e.ok]
    if bad:
        detail = "; ".join(f"{e.name}: max abs {e.max_abs:.3g} > {e.tolerance:.3g}" for e in bad)
        shown = target_of(report.path)
        raise CheckError(
            f"{shown}: tract disagrees with Hugging Face (nothing written) — {detail}", report.errors
        )
    for case, actual in zip(original, got[len(reference) :], strict=True):
        names = [f"{n} ({case.label})" for n in layout.output_names()]
        report.original_errors += compare(names, [t.numpy() for t in case.outputs], actual, float("inf"))


def _long_prefill(report: ExportReport) -> int | None:
    """A prefill one token past the RoPE switch, when the model has one the check can reach."""
    switch = report.properties.get("torchlower.llm.recompute_cache_at")
    if not isinstance(switch, int):
        return None
    if switch + 1 > checks.LONG_CHECK_LIMIT:
        log.warning(
            "positions past %d use the long RoPE factors; the check does not reach them "
            "(a %d-token prefill), only the short ones are verified",
            switch,
            switch + 1,
        )
        return None
    return switch + 1


def table_storage(compress: str | None, embeddings: str | None, lm_head: str | None) -> dict[str, str]:
    """Storage of the embedding table and the LM head (the defaults of ``export``)."""
    head = lm_head or ("q4_0" if compress == "q4_0" else embeddings or "f32")
    return {"embeddings": embeddings or "f32", "lm_head": head}


def _validate_options(
    precision: str, compress: str | None, embeddings: str | None, lm_head: str | None, logits: str,
    max_context: int | None, check: bool, io_samples: bool,
) -> None:  # fmt: skip
    for name, value, allowed in (
        ("precision", precision, PRECISIONS),
        ("compress", compress, COMPRESSIONS),
        ("embeddings", embeddings, EMBEDDINGS),
        ("lm_head", lm_head, EMBEDDINGS),
        ("logits", logits, LOGITS),
    ):
        if value not in allowed:
            raise InvalidArgumentError(f"{name} must be one of {', '.join(map(str, allowed))}; got {value!r}")
    if max_context is not None and (
        isinstance(max_context, bool) or not isinstance(max_context, int) or max_context < 2
    ):
        raise InvalidArgumentError(f"max_context must be an int >= 2, got {max_context!r}")
    for name, flag in (("check", check), ("io_samples", io_samples)):
        if not isinstance(flag, bool):
            raise InvalidArgumentError(f"{name} must be True or False, got {flag!r}")


def _refuse_causal_options(
    embeddings: str | None, lm_head: str | None, logits: str, f32_parts: Any, lora: Any = None,
    kind: str = "a speech encoder-decoder (Whisper, Speech2Text, Moonshine)",
) -> None:  # fmt: skip
    """Options of the causal-LM export a multi-archive export does not honour yet."""
    given = {"embeddings": embeddings, "lm_head": lm_head, "f32_parts": f32_parts, "lora": lora}
    given |= {"logits": logits if logits != "last" else None}
    used = [k for k, v in given.items() if v is not None]
    if used:
        raise InvalidArgumentError(
            f"{', '.join(used)}: not available for the export of {kind}; leave them"
            " out, or export the decoder alone with part='decoder'"
        )


def _f32_parts(precision: str, parts: tuple[str, ...] | None) -> tuple[str, ...]:
    if parts is None:
        return DEFAULT_F32_PARTS if precision == "f16" else ()
    if isinstance(parts, str) or not all(p in F32_PARTS for p in parts):
        raise InvalidArgumentError(
            f"f32_parts must be a tuple of {', '.join(F32_PARTS)} (or () for f16 throughout); got {parts!r}"
        )
    if parts and precision != "f16":
        raise InvalidArgumentError(f"f32_parts={parts!r} needs precision='f16' (an f32 export is all f32)")
    return tuple(p for p in F32_PARTS if p in parts)


def _size_on_disk(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return path.stat().st_size


__all__ = ["ExportReport", "SourceError", "WrongModelError", "export"]

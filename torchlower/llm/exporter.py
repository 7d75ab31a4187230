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
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchlower import __version__
from torchlower.core import dynamic, progress
from torchlower.core import tolerance as tolerances
from torchlower.core.comparison import OutputError
from torchlower.core.model_io import eval_view
from torchlower.core.staging import staged as staged_beside
from torchlower.core.staging import target_of
from torchlower.errors import DynamicAxisError, InvalidArgumentError
from torchlower.llm import bundle, checks
from torchlower.llm.alibi import alibi_table
from torchlower.llm.compress import share_tied_table
from torchlower.llm.kv_pattern import unsplit_query_concats
from torchlower.llm.last_row import drop_last_guard
from torchlower.llm.moe import dense_experts
from torchlower.llm.precision import DEFAULT_F32_PARTS, F32_PARTS, cache_dtype, drop_cache_casts, keep_f32
from torchlower.llm.rope import rotary_tables
from torchlower.llm.source import SourceError, check_tokenizer, open_source
from torchlower.llm.wrapper import (
    CachedCausalLM,
    CacheLayout,
    attributes_kept,
    dynamic_rope_limit,
    layout_of,
    plain_linears,
    rope_switch_length,
    static_rope,
)
from torchlower.nnef import archive, guards, passes
from torchlower.pipeline import validate
from torchlower.pipeline.export import _build, _bytes_by_format

log = logging.getLogger("torchlower")

PRECISIONS = ("f32", "f16")
COMPRESSIONS = (None, "q4_0")
EMBEDDINGS = (None, "f32", "f16", "q4_0")
LOGITS = ("last", "all")
# torch itself running these models in f16 differs from f32 by up to ~3 % of the largest logit
# (docs/llm.md); the f16 check allows that much, 3x the generic f16 tolerance
F16_TOLERANCE = 3e-2
UNBOUNDED_CONTEXT = 2048  # default P + S bound of a model without a position limit (ALiBi)
TRACE_PAST, TRACE_SEQ = 5, 3  # distinct sizes so torch.export keeps P and S apart


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
) -> ExportReport:
    """Export a causal LM (a ``save_pretrained`` folder or a loaded model) for tract.

    Graph inputs ``input_ids`` [1, S] and per layer ``in_cache_key_{i}``/``in_cache_value_{i}``
    [1, kv_heads, P, head_dim]; outputs ``outputs`` (logits: [1, 1, vocab] with
    ``logits="last"``, [1, S, vocab] with ``"all"``) and ``out_cache_key_{i}``/
    ``out_cache_value_{i}`` [1, kv_heads, P+S, head_dim], with ``P + S <= max_context``.
    ``compress="q4_0"`` stores the linear layers in 4-bit blocks. ``embeddings`` picks the
    storage of the token embedding table (default f32) and ``lm_head`` that of the LM head
    (default: q4_0 with ``compress="q4_0"``, as the reference exporter's ``min_max_q4_0``
    does, else the ``embeddings`` choice); each of ``f32``, ``f16``, ``q4_0``.
    ``f32_parts`` (f16 only): parts computed in f32 inside the f16 graph, any of
    ``"attention"``, ``"norms"``, ``"lm_head"``; default ``("attention", "norms")``, ``()`` for
    f16 throughout (``precision.keep_f32``).
    ``check`` compares with the model as Hugging Face runs it; a failed export writes nothing.
    """
    started = time.perf_counter()
    _validate_options(precision, compress, embeddings, lm_head, logits, max_context, check, io_samples)
    storage = table_storage(compress, embeddings, lm_head)
    parts = _f32_parts(precision, f32_parts)
    target = Path(path)
    archive.archive_kind(target)  # a bad suffix fails before the model loads
    with progress.stage("loading model"):
        src = open_source(source)
    model = eval_view(src.model)
    config = src.text_config
    limit, why = _max_positions(config)
    rope_limit = dynamic_rope_limit(model)
    if rope_limit is not None and (limit is None or rope_limit < limit):
        limit, why = rope_limit, "dynamic RoPE rescales beyond original_max_position_embeddings"
    context = max_context or limit or UNBOUNDED_CONTEXT  # ALiBi models have no position table
    if limit is not None and context > limit:
        raise InvalidArgumentError(
            f"max_context={max_context} exceeds the model's {limit} positions "
            f"({_where(src.folder)}config.json: {why}); pass max_context <= {limit}"
        )
    vocab = int(config.vocab_size)
    check_tokenizer(src.files, vocab, src.folder)
    layout = layout_of(model)  # one 2-token forward: reads every weight once
    if src.mapping is not None:
        src.mapping.release_all()
    wrapper = CachedCausalLM(model, layout, logits, cache_dtype(precision)).eval()

    names_in, names_out = layout.input_names(), layout.output_names()
    example = _trace_example(layout, vocab, cache_dtype(precision))
    # bounded as the graph asserts: torch.export refuses a size its position tables cannot hold
    axes = {"input_ids": {1: ("S", 1, int(context))}} | {n: {2: ("P", 1, int(context))} for n in names_in[1:]}
    spec = dynamic.Spec.build(
        validate.dynamic_axes(axes, names_in, [t.dim() for t in example]),
        names_in,
        example,
        validate.dynamic_bounds(axes),
    )
    tracing = progress.stage("tracing (export)", unit="ops")
    with (
        tracing,
        attributes_kept(model),
        static_rope(model),
        plain_linears(model),
        rotary_tables(model, context),
        alibi_table(model, context),
        dense_experts(model),
    ):
        try:
            builder = _build("export", wrapper, example, names_in, names_out, len(names_out), precision, spec)
        except DynamicAxisError as exc:
            raise _context_fix(exc, int(context)) from exc
    tied = (
        share_tied_table(builder, wrapper) if storage["embeddings"] == storage["lm_head"] != "q4_0" else None
    )
    dequantized, left_float = None, {}
    if compress is not None or "q4_0" in storage.values():
        from torchlower.llm.compress import compress_weights

        release = src.mapping.release if src.mapping is not None else None
        keep = check or io_samples
        dequantized, left_float = compress_weights(builder, wrapper, compress, storage, keep, release)
    halves = {role for role, kind in storage.items() if kind == "f16"}
    if halves and precision == "f32":
        from torchlower.llm.compress import store_f16

        dequantized = (dequantized or {}) | store_f16(builder, wrapper, halves)
        if tied is not None and tied[0] in dequantized:  # one f16 tensor serves both roles
            dequantized[tied[1]] = dequantized[tied[0]]
    if precision == "f16":
        drop_cache_casts(builder)
    guards.before_passes(builder)
    passes.optimize(builder)
    guards.apply(builder)
    unsplit_query_concats(builder)
    if logits == "last" and not wrapper.own_mask:  # the wrapper's mask has no empty row
        drop_last_guard(builder)
    keep_f32(builder, wrapper, parts)
    if src.mapping is not None:
        src.mapping.release_all()  # folds and passes may have read some weights
    weights = builder.live_weights()
    parameters = sum(p.numel() for p in model.parameters())
    props: dict[str, str | int | float] = {
        "torchlower.version": __version__,
        "torchlower.llm.model_type": src.model_type,
        "torchlower.llm.architecture": type(model).__name__,
        "torchlower.llm.parameters": parameters,
        "torchlower.llm.layers": layout.layers,
        "torchlower.llm.max_context": int(context),
        "torchlower.llm.precision": precision,
        "torchlower.llm.compress": compress or "none",
        "torchlower.llm.embeddings": storage["embeddings"],
        "torchlower.llm.lm_head": storage["lm_head"],
        "torchlower.llm.logits": logits,
    }
    switch = rope_switch_length(config, int(context))
    if switch is not None:
        props["torchlower.llm.recompute_cache_at"] = switch
    if precision == "f16":
        props["torchlower.llm.f32_parts"] = ",".join(parts) or "none"
    bounds = [f"tract_assert P + S <= {context}", "tract_assert S >= 1", "tract_assert P >= 0"]
    graph = bundle.with_header(builder.graph_text(), bounds, bundle.properties_fragment(props))
    files = dict(src.files)
    if io_samples:
        files |= checks.samples(model, layout, vocab, logits, dequantized, cache_dtype(precision))
    release = src.mapping.release if src.mapping is not None else None
    with staged_beside(target) as staging:  # renamed after the check: a failure leaves no archive
        staged = archive.write(
            staging, graph, weights, builder.quant_text(), files, release, huffman_only=True
        )
        report = ExportReport(
            path=staged,
            model_type=src.model_type,
            parameters=parameters,
            layers=layout.layers,
            max_context=int(context),
            precision=precision,
            compress=compress,
            embeddings=storage["embeddings"],
            lm_head=storage["lm_head"],
            logits=logits,
            weight_bytes=sum(archive.weight_bytes(t) for t in weights.values()),
            weight_bytes_by_format=_bytes_by_format(weights),
            archive_bytes=_size_on_disk(staged),
            seconds=0.0,
            bundled=sorted(files),
            properties=props,
            unquantized=left_float,
        )
        if check:
            with progress.stage("checking in tract"), attributes_kept(model):
                _check(report, model, layout, vocab, logits, precision, dequantized)
    report.path = target
    report.seconds = time.perf_counter() - started
    return report


def _check(
    report: ExportReport,
    model: nn.Module,
    layout: CacheLayout,
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


def _context_fix(exc: DynamicAxisError, context: int) -> DynamicAxisError:
    """torch.export's bounds on S and P, said as the ``max_context`` that satisfies them."""
    limits = [int(n) for n in re.findall(r"<= [SP] <= (\d+)", str(exc))]
    if not limits or min(limits) >= context:
        return exc
    return DynamicAxisError(
        f"{exc}\ntorchlower.llm: the model traces for at most {min(limits)} positions per call, "
        f"fewer than max_context={context}; export with max_context={min(limits)}"
    )


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


_POSITION_FIELDS = (
    "max_position_embeddings",
    "n_positions",
    "max_sequence_length",
    "seq_length",
    "max_seq_len",  # MPT: the rows of its ALiBi table
)


def _max_positions(config: Any) -> tuple[int | None, str]:
    """The config's position limit and the field it came from (MPT: its ALiBi table's rows)."""
    for attr in _POSITION_FIELDS:
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value, attr
    return None, "no position limit"


def _trace_example(layout: CacheLayout, vocab: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, TRACE_SEQ), generator=g)
    past = [torch.randn(t.shape, generator=g).to(dtype) for t in layout.empty(TRACE_PAST)]
    return (ids, *past)


def _where(folder: Path | None) -> str:
    return f"{folder}/" if folder is not None else "the model's "


def _size_on_disk(path: Path) -> int:
    if path.is_dir():
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    return path.stat().st_size


__all__ = ["ExportReport", "SourceError", "export"]

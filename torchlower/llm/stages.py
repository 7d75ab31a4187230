"""The stages of ``torchlower.llm.export`` between validation and writing: load the checkpoint,
capture the cached wrapper through ``pipeline.capture`` (export front end), store the tables,
then ``pipeline.optimize`` and the LLM's own passes. ``exporter.export`` composes them with
the pipeline's ``write`` stage and its own check against Hugging Face."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchlower.core import dynamic, progress
from torchlower.core.model_io import eval_view
from torchlower.errors import DynamicAxisError, InvalidArgumentError
from torchlower.llm.alibi import alibi_table
from torchlower.llm.compress import share_tied_table
from torchlower.llm.kv_pattern import unsplit_query_concats
from torchlower.llm.last_row import drop_last_guard
from torchlower.llm.lora import adapter_labels
from torchlower.llm.moe import dense_experts
from torchlower.llm.precision import cache_dtype, drop_cache_casts, keep_f32
from torchlower.llm.rope import rotary_tables
from torchlower.llm.source import check_tokenizer, open_source
from torchlower.llm.ssm import StatefulCausalLM, StateLayout, is_state_space, state_layout
from torchlower.llm.wrapper import (
    KEEP_INPUT,
    CachedCausalLM,
    CacheLayout,
    attributes_kept,
    dynamic_rope_limit,
    layout_of,
    plain_linears,
    static_rope,
)
from torchlower.nnef.builder import NNEFBuilder
from torchlower.pipeline import capture as pipeline_capture
from torchlower.pipeline import optimize as pipeline_optimize
from torchlower.pipeline import validate

LORA_KEPT = "LoRA adapter matrix, kept float so another adapter of the same rank can replace it"
UNBOUNDED_CONTEXT = 2048  # default P + S bound of a model without a position limit (ALiBi)
TRACE_PAST, TRACE_SEQ = 5, 3  # distinct sizes so torch.export keeps P and S apart
_POSITION_FIELDS = (
    "max_position_embeddings",
    "n_positions",
    "max_sequence_length",
    "seq_length",
    "max_seq_len",  # MPT: the rows of its ALiBi table
    "max_target_positions",  # Whisper, Speech2Text, Moonshine's decoders
)
_POSITION_TABLES = ("wpe", "embed_positions", "position_embeddings", "embed_position", "pos_embed")


@dataclass
class Loaded:
    """The checkpoint as loaded: the model (an eval view), its source and its limits."""

    src: Any  # llm.source.Source
    model: nn.Module
    config: Any
    context: int  # the P + S bound the archive declares
    vocab: int
    layout: CacheLayout | StateLayout  # a KV cache, or a state-space model's fixed-size states


@dataclass
class Captured:
    """The cached wrapper and the graph it lowered to."""

    wrapper: CachedCausalLM | StatefulCausalLM
    builder: NNEFBuilder


def load(source: Any, max_context: int | None, part: str | None = None) -> Loaded:
    """Open the checkpoint, bound the context by its position tables, read its cache layout."""
    with progress.stage("loading model"):
        src = open_source(source, part)
    model = eval_view(src.model)
    config = src.text_config
    limit, why = max_positions(config, model)
    rope_limit = dynamic_rope_limit(model)
    if rope_limit is not None and (limit is None or rope_limit < limit):
        limit, why = rope_limit, "dynamic RoPE rescales beyond original_max_position_embeddings"
    context = max_context or limit or UNBOUNDED_CONTEXT  # ALiBi models have no position table
    if limit is not None and context > limit:
        raise InvalidArgumentError(
            f"max_context={max_context} exceeds the model's {limit} positions "
            f"({where(src.folder)}config.json: {why}); pass max_context <= {limit}"
        )
    vocab = int(config.vocab_size)
    check_tokenizer(src.files, vocab, src.folder)
    # one 2-token forward: reads every weight once
    layout = state_layout(model) if is_state_space(model) else layout_of(model)
    if src.mapping is not None:
        src.mapping.release_all()
    return Loaded(src, model, config, int(context), vocab, layout)


def capture(loaded: Loaded, logits: str, precision: str) -> Captured:
    """The wrapper traced by the export front end with P and S symbolic and bounded."""
    model, layout, context = loaded.model, loaded.layout, loaded.context
    wrapper: CachedCausalLM | StatefulCausalLM
    if isinstance(layout, StateLayout):  # fixed-size states: only S is dynamic
        if logits == "keep":
            raise InvalidArgumentError(
                "logits='keep' (a logits_to_keep input) is not supported for state-space models yet:"
                " export with logits='last' or 'all'"
            )
        names_in = layout.input_names()
        wrapper = StatefulCausalLM(model, layout, logits, cache_dtype(precision)).eval()
        axes = layout.axes(context)
    else:
        names_in = layout.input_names(logits)
        wrapper = CachedCausalLM(model, layout, logits, cache_dtype(precision)).eval()
        # bounded as the graph asserts: torch.export refuses a size its position tables cannot hold
        caches = names_in[1 : 1 + 2 * layout.layers]
        axes = {"input_ids": {1: ("S", 1, context)}} | {n: {2: ("P", 1, context)} for n in caches}
        if logits == "keep":
            axes[KEEP_INPUT] = {0: ("K", 1, context)}
    names_out = layout.output_names()
    example = trace_example(layout, loaded.vocab, cache_dtype(precision), logits)
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
            builder = pipeline_capture.lower(
                "export", wrapper, example, names_in, names_out, len(names_out), precision, spec
            )
        except DynamicAxisError as exc:
            raise context_fix(exc, context) from exc
    return Captured(wrapper, builder)


def store_tables(
    loaded: Loaded,
    captured: Captured,
    compress: str | None,
    storage: dict[str, str],
    precision: str,
    keep: bool,
) -> tuple[dict[str, torch.Tensor] | None, dict[str, str]]:
    """Embedding table and LM head in their storage (shared when tied), linear layers packed
    with ``compress``; returns the dequantized weights the check runs and what stayed float."""
    builder, wrapper, src = captured.builder, captured.wrapper, loaded.src
    tied = (
        share_tied_table(builder, wrapper) if storage["embeddings"] == storage["lm_head"] != "q4_0" else None
    )
    dequantized, left_float = None, {}
    if compress is not None or "q4_0" in storage.values():
        from torchlower.llm.compress import compress_weights

        release = src.mapping.release if src.mapping is not None else None
        adapters = dict.fromkeys(adapter_labels(wrapper), LORA_KEPT)
        dequantized, left_float = compress_weights(
            builder, wrapper, compress, storage, keep, release, adapters
        )
    halves = {role for role, kind in storage.items() if kind == "f16"}
    if halves and precision == "f32":
        from torchlower.llm.compress import store_f16

        dequantized = (dequantized or {}) | store_f16(builder, wrapper, halves)
        if tied is not None and tied[0] in dequantized:  # one f16 tensor serves both roles
            dequantized[tied[1]] = dequantized[tied[0]]
    return dequantized, left_float


def optimize(loaded: Loaded, captured: Captured, precision: str, logits: str, parts: tuple[str, ...]) -> None:
    """The pipeline's guards and passes, then the LLM's own rewrites."""
    builder, wrapper = captured.builder, captured.wrapper
    if loaded.src.mapping is not None:  # the passes that read every weight drop its pages as they go
        builder.release = loaded.src.mapping.release
    if precision == "f16":
        drop_cache_casts(builder)
    pipeline_optimize.optimize(builder)
    unsplit_query_concats(builder)
    if logits == "last" and not wrapper.own_mask:  # the wrapper's mask has no empty row
        drop_last_guard(builder)
    keep_f32(builder, wrapper, parts)
    if loaded.src.mapping is not None:
        loaded.src.mapping.release_all()  # folds and passes may have read some weights


def context_fix(exc: DynamicAxisError, context: int) -> DynamicAxisError:
    """torch.export's bounds on S and P, said as the ``max_context`` that satisfies them."""
    limits = [int(n) for n in re.findall(r"<= [SP] <= (\d+)", str(exc))]
    if not limits or min(limits) >= context:
        return exc
    return DynamicAxisError(
        f"{exc}\ntorchlower.llm: the model traces for at most {min(limits)} positions per call, "
        f"fewer than max_context={context}; export with max_context={min(limits)}"
    )


def max_positions(config: Any, model: nn.Module | None = None) -> tuple[int | None, str]:
    """The model's position limit and where it came from: the config's field (MPT: its ALiBi
    table's rows; Whisper: ``max_target_positions``) and the rows of a learned position table
    (GPT-2's ``wpe``, OPT's ``embed_positions`` less its offset), whichever is smaller."""
    found: list[tuple[int, str]] = []
    for attr in _POSITION_FIELDS:
        value = getattr(config, attr, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            found.append((value, attr))
            break
    if model is not None:
        found += position_tables(model)
    if not found:
        return None, "no position limit"
    return min(found)


def position_tables(model: nn.Module) -> list[tuple[int, str]]:
    """(positions, why) of every learned position table: an ``nn.Embedding`` named as one."""
    out = []
    for name, module in model.named_modules():
        leaf = name.rpartition(".")[2]
        if isinstance(module, nn.Embedding) and leaf in _POSITION_TABLES:
            offset = getattr(module, "offset", 0)
            offset = offset if isinstance(offset, int) else 0
            rows = int(module.num_embeddings) - offset
            extra = f" less its offset {offset}" if offset else ""
            out.append((rows, f"{name} has {module.num_embeddings} rows{extra}"))
    return out


def trace_example(
    layout: CacheLayout | StateLayout, vocab: int, dtype: torch.dtype, logits: str = "last"
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, TRACE_SEQ), generator=g)
    past = [torch.randn(t.shape, generator=g).to(dtype) for t in layout.empty(TRACE_PAST)]
    keep = [torch.arange(1, TRACE_SEQ)] if logits == "keep" else []  # K = 2, apart from S and P
    return (ids, *past, *keep)


def where(folder: Path | None) -> str:
    return f"{folder}/" if folder is not None else "the model's "

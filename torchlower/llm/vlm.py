"""``torchlower.llm.export`` of a multimodal LM (LLaVA, …): a folder of three archives and a manifest.

``OUT/embed.nnef.tgz`` maps token ids to the decoder's input embeddings; ``OUT/vision.nnef.tgz``
(or ``audio.nnef.tgz``) maps one item of media to its feature rows in the decoder's hidden size
(encoder and projector); ``OUT/decoder.nnef.tgz`` is the causal LM fed embeddings, with the KV
cache in tract's naming (``wrapper.EmbedsCausalLM``), so one decoder graph serves text-only and
multimodal steps. ``OUT/manifest.json`` says how they connect (docs/llm.md): the placeholder
token whose rows the features replace, the rows per item, the encoder's input shape and the
preprocessing it expects. Each part is lowered and checked against PyTorch by the pipeline's
stages (``part_export.py``); then the three run together in tract (``vlm_runner.py``) against
Hugging Face's ``…ForConditionalGeneration`` on a prompt with media: greedy tokens and every
step's logits. A failed check writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
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
from torchlower.llm import stages
from torchlower.llm.part_export import dequantized_model, export_part, folder_target, judge_decoding, naming
from torchlower.llm.precision import DEFAULT_F32_PARTS, keep_f32
from torchlower.llm.rope import rotary_tables
from torchlower.llm.vlm_families import (
    attention,
    decoder_feeds,
    language_model,
    media_example,
    media_inputs,
    media_part,
    positions,
    preprocessing,
)
from torchlower.llm.vlm_parts import EmbedPart, MediaLayout
from torchlower.llm.wrapper import (
    BlockCausalLM,
    CacheLayout,
    EmbedsCausalLM,
    MropeCausalLM,
    attributes_kept,
    cache_arg,
    layout_of,
    present_cache,
    static_rope,
)
from torchlower.pipeline import report

MANIFEST = "manifest.json"
FORMAT = "torchlower.multimodal_lm"
EMBED, DECODER = "embed.nnef.tgz", "decoder.nnef.tgz"
CHECK_TOKENS = 8  # greedy steps the export runs against HF
_PART = "torchlower.llm.part"
TEXT_AROUND = (3, 2)  # text tokens before and after the media in the check's prompt


@dataclass
class MultimodalReport:
    """What was written and how far tract is from Hugging Face (each part and end to end)."""

    path: Path
    model_type: str
    architecture: str
    parameters: int
    layers: int
    max_context: int
    precision: str
    compress: str | None
    embed: report.ExportReport
    encoder: report.ExportReport  # the media encoder (vision or audio) and its projector
    decoder: report.ExportReport
    media: dict[str, Any]  # the manifest's ``media``: placeholder token, rows per item, input
    archive_bytes: int = 0
    seconds: float = 0.0
    bundled: list[str] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)  # tract's greedy tokens in the check
    reference_tokens: list[int] = field(default_factory=list)  # HF's
    logit_error: float = float("nan")  # max |HF − tract| over the logits of every checked step

    @property
    def errors(self) -> list[Any]:
        return [*self.embed.errors, *self.encoder.errors, *self.decoder.errors]


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
    mapping: Any = None,
) -> MultimodalReport:
    """Write ``path`` (a folder) with the embedding, media encoder and decoder archives and
    their manifest; ``io_samples`` bundles each part's example and outputs (``io/example.npz``);
    ``mapping``: the ``stream.Mapping`` the weights view (``part_export``)."""
    started = time.perf_counter()
    target = folder_target(path, "a multimodal LM")
    model = model.eval()
    layout = layout_of(model)
    context = _context(model, max_context)
    encoder, media = media_part(model)
    props = _properties(model, layout, context, precision, compress)
    with staged(target) as folder, naming(folder, target):
        folder.mkdir()
        common = (precision, compress, check)
        with progress.stage("embedding"):
            embed_part = EmbedPart(model).eval()
            ids = torch.randint(0, layout_vocab(model), (1, 3), generator=torch.Generator().manual_seed(0))
            emb, emb_weights = export_part(
                embed_part, (ids,), folder / EMBED, ["input_ids"], ["inputs_embeds"],
                {"input_ids": {1: ("S", 1, context)}}, *common, [], props | {_PART: "embed"}, {},
                io_samples=io_samples, mapping=mapping,
            )  # fmt: skip
        with progress.stage(media.part):
            enc, enc_weights = export_part(
                encoder, media_example(media, 0), folder / f"{media.part}.nnef.tgz", media.input_names,
                media.output_names, None, *common, [], props | {_PART: media.part}, {}, media.frontend,
                io_samples=io_samples, mapping=mapping,
            )  # fmt: skip
        with progress.stage("decoder"):
            decoder, (dec, dec_weights) = _export_decoder(
                model, layout, folder, context, common, props, files, io_samples, mapping
            )
        manifest = _manifest(model, layout, media, context, precision, compress, files)
        (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
        result = MultimodalReport(
            folder, str(model.config.model_type), type(model).__name__,
            sum(p.numel() for p in model.parameters()), layout.layers, context, precision, compress,
            emb, enc, dec, manifest["media"], bundled=sorted(files),
        )  # fmt: skip
        if check:
            reference_model = dequantized_model(
                model, (embed_part, emb_weights), (encoder, enc_weights), (decoder, dec_weights)
            )
            with progress.stage("checking against Hugging Face"):
                _check_end_to_end(result, model, reference_model, encoder, media, precision)
        result.archive_bytes = sum(f.stat().st_size for f in folder.iterdir())
    result.path = target
    for name, part in (("embed", EMBED), ("encoder", f"{media.part}.nnef.tgz"), ("decoder", DECODER)):
        getattr(result, name).path = target / part
    result.seconds = time.perf_counter() - started
    return result


def _export_decoder(
    model: nn.Module, layout: CacheLayout, folder: Path, context: int, common: tuple[Any, ...],
    props: dict[str, Any], files: dict[str, bytes], io_samples: bool, mapping: Any,
) -> tuple[nn.Module, tuple[report.ExportReport, dict[str, torch.Tensor] | None]]:  # fmt: skip
    """The decoder fed embeddings (and Qwen2-VL's positions or Gemma 3's image blocks) with the
    KV cache, and its export."""
    mrope = positions(model) is not None
    feeds = decoder_feeds(model)
    kind = MropeCausalLM if mrope else BlockCausalLM if "image_blocks" in feeds else EmbedsCausalLM
    decoder = kind(model, layout).eval()
    names_in = [*feeds, *layout.input_names()[1:]]
    axes = {
        "inputs_embeds": {1: ("S", 1, context)},
        "position_ids": {2: ("S", 1, context)},
        "image_blocks": {1: ("S", 1, context)},
    }
    axes = {n: axes[n] for n in feeds} | {n: {2: ("P", 1, context)} for n in names_in[len(feeds) :]}
    hidden = int(model.get_input_embeddings().embedding_dim)
    # M-RoPE's [3, 1, S] positions take the computed rotary form (the tables index [1, S])
    tables = contextlib.nullcontext() if mrope else rotary_tables(model, context)
    with attributes_kept(model), static_rope(model), tables:
        return decoder, export_part(
            decoder, _decoder_example(layout, hidden, feeds), folder / DECODER, names_in,
            layout.output_names(), axes, *common, _bounds(context), props | {_PART: "decoder"}, files,
            rewrite=_f32_parts(decoder, common[0]), io_samples=io_samples, mapping=mapping,
        )  # fmt: skip


def layout_vocab(model: nn.Module) -> int:
    return int(model.config.get_text_config(decoder=True).vocab_size)


def _context(model: nn.Module, max_context: int | None) -> int:
    """The decoder's P + S bound: the language model's position limit (not the media tower's)."""
    limit, why = stages.max_positions(model.config.get_text_config(decoder=True), language_model(model))
    limit = limit or stages.UNBOUNDED_CONTEXT
    if max_context is not None and max_context > limit:
        raise InvalidArgumentError(
            f"max_context={max_context} exceeds the language model's {limit} positions ({why});"
            f" pass max_context <= {limit}"
        )
    return int(max_context or limit)


def _decoder_example(layout: CacheLayout, hidden: int, names: list[str]) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    embeds = torch.randn(1, stages.TRACE_SEQ, hidden, generator=g)
    feeds = [embeds]
    if "position_ids" in names:  # three position rows continuing the cache
        feeds.append(torch.arange(stages.TRACE_PAST, stages.TRACE_PAST + stages.TRACE_SEQ).expand(3, 1, -1))
    if "image_blocks" in names:  # text, then one image block: both branches of the mask
        seq = stages.TRACE_SEQ
        feeds.append((torch.arange(seq) >= seq // 2).long()[None])
    return (*feeds, *[torch.randn(t.shape, generator=g) for t in layout.empty(stages.TRACE_PAST)])


def _f32_parts(decoder: nn.Module, precision: str) -> Callable[[Any], object] | None:
    """f16: attention and norms computed in f32, as the causal-LM export's default (``keep_f32``)."""
    if precision != "f16":
        return None
    return lambda builder: keep_f32(builder, decoder, DEFAULT_F32_PARTS)


def _bounds(context: int) -> list[str]:
    return [f"tract_assert P + S <= {context}", "tract_assert S >= 1", "tract_assert P >= 0"]


def check_prompt(media: MediaLayout, vocab: int, slots: int, seed: int = 0) -> torch.Tensor:
    """Text ids around ``slots`` placeholder tokens (one per feature row), as a processor writes
    them; the text avoids the placeholder id."""
    g = torch.Generator().manual_seed(seed)
    before, after = (torch.randint(0, vocab, (n,), generator=g) for n in TEXT_AROUND)
    before, after = (torch.where(t == media.token_id, (t + 1) % vocab, t) for t in (before, after))
    return torch.cat([before, torch.full((slots,), media.token_id), after])[None]


def _check_end_to_end(
    result: MultimodalReport, model: nn.Module, reference: nn.Module, encoder: nn.Module, media: MediaLayout,
    precision: str,
) -> None:  # fmt: skip
    """Greedy tokens and every step's logits of tract (media encoded once, decoder step by step)
    vs HF running the weights the archives hold, both with their caches as ``generate`` does.
    f16 is reported, not bounded (the reference runs in f32)."""
    from torchlower.llm.vlm_runner import MultimodalRunner

    item = media_example(media, 1)
    with torch.no_grad():
        slots = int(encoder(*item)[1]) if media.count_name else media.tokens
    prompt = check_prompt(media, layout_vocab(model), slots)
    steps = min(CHECK_TOKENS, result.max_context - prompt.shape[1])
    runner = MultimodalRunner(result.path)
    tokens, logits = runner.greedy(prompt.numpy(), steps, item[0].numpy(), *[t.numpy() for t in item[1:]])
    inputs = media_inputs(model, media, item, prompt)

    def hf(kind: str, forced: list[int] | None) -> tuple[list[int], np.ndarray]:
        return hf_decode(reference if kind == "reference" else model, prompt, inputs, steps, forced=forced)

    judge_decoding(
        result, f"{media.part} encoder + decoder", tokens, logits, hf, reference is model, precision
    )


def hf_decode(
    model: nn.Module,
    prompt: torch.Tensor,
    media: dict[str, torch.Tensor],
    steps: int,
    forced: list[int] | None = None,
) -> tuple[list[int], np.ndarray]:
    """HF's own cached decoding with the media in the first call (what ``generate`` does for
    greedy search): arg-max tokens and each step's logits [steps, vocab]; ``forced`` feeds
    those tokens instead (the logits HF gives for tract's chain)."""
    from transformers.cache_utils import DynamicCache

    tokens: list[int] = []
    rows: list[np.ndarray] = []
    cache: Any = DynamicCache()
    feed, extra = prompt, media
    with torch.no_grad():
        for i in range(steps):
            out = model(input_ids=feed, use_cache=True, **{cache_arg(model): cache}, **extra)
            cache, extra = present_cache(out), {}
            rows.append(out.logits[0, -1].float().numpy())
            tokens.append(int(out.logits[0, -1].argmax()) if forced is None else forced[i])
            feed = torch.tensor([[tokens[-1]]])
    return tokens, np.stack(rows)


def _properties(
    model: nn.Module, layout: CacheLayout, context: int, precision: str, compress: str | None
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


def _manifest(
    model: nn.Module, layout: CacheLayout, media: MediaLayout, context: int, precision: str,
    compress: str | None, files: dict[str, bytes],
) -> dict[str, Any]:  # fmt: skip
    """How the archives connect (docs/llm.md)."""
    text = model.config.get_text_config(decoder=True)
    cache = layout.input_names()[1:]
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return {
        "format": FORMAT,
        "version": 1,
        "model_type": str(model.config.model_type),
        "architecture": type(model).__name__,
        "embed": {"archive": EMBED, "inputs": {"input_ids": [1, "S"]}, "outputs": ["inputs_embeds"]},
        media.part: {
            "archive": f"{media.part}.nnef.tgz",
            "inputs": {media.input_name: list(media.input_shape)}
            | ({media.mask_name: [1, media.input_shape[-1]]} if media.mask_name else {}),
            "outputs": media.output_names,
            "output_shape": [1, media.tokens, media.hidden],
            "preprocessing": preprocessing(files, media.part),
        },
        "decoder": {
            "archive": DECODER,
            "inputs": [*decoder_feeds(model), *cache],
            "outputs": layout.output_names(),
        },
        "media": {
            "part": media.part,
            "input": media.input_name,
            "token_id": media.token_id,
            "tokens_per_item": media.tokens,
            "mask_input": media.mask_name,  # which frames are real; None: every item is whole
            "count_output": media.count_name,  # how many rows are real; None: all tokens_per_item
            "hidden_size": media.hidden,
            "placement": "the prompt's rows at token_id, in order, take the feature rows",
        },
        "positions": positions(model),  # None: arange(P, P + S) inside the decoder
        "attention": attention(model),  # None: causal (and windowed) from positions alone
        "max_context": context,
        "vocab_size": int(text.vocab_size),
        "hidden_size": int(model.get_input_embeddings().embedding_dim),
        "eos_token_id": [int(e) for e in ([eos] if isinstance(eos, int) else eos or [])],
        "precision": precision,
        "compress": compress or "none",
    }

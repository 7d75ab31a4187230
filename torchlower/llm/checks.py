"""Reference inputs and outputs of an LLM export, computed by Hugging Face itself.

The reference is the model called the way ``generate`` calls it (its own positions, its own
mask code, its own cache), not our wrapper: a mistake in the wrapper's mask or positions then
shows up as a difference instead of being copied into both sides.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from torchlower.llm.bundle import npz
from torchlower.llm.wrapper import CacheLayout, cache_tensors, hf_forward, present_cache

PROMPT, CONTINUATION, GENERATED = 6, 3, 16
# longest extra prefill the check runs to reach a length-switched branch (longrope's long factors)
LONG_CHECK_LIMIT = 512


@dataclass
class Case:
    label: str
    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]


def reference_cases(
    model: nn.Module,
    layout: CacheLayout,
    vocab: int,
    logits: str,
    weights: dict[str, torch.Tensor] | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    long_prefill: int | None = None,
) -> list[Case]:
    """Prefill from an empty cache, a 3-token continuation with past, then one decode step.

    ``long_prefill``: also a prefill of that many tokens, for a graph whose numbers switch
    past a length (longrope picks its long factors when P + S > original positions).
    """
    prompt, more, step = reference_inputs(vocab, seed)
    run = _runner(model, weights)
    cases: list[Case] = []
    past: list[torch.Tensor] = layout.empty(0, dtype)
    cache = None
    for label, ids in (("prefill P=0", prompt), ("with past P=6", more), ("decode P=9", step)):
        out = run(ids, cache)
        cache = present_cache(out)
        cases.append(_case(label, ids, past, out, logits))
        past = [t.to(dtype) for t in cases[-1].outputs[1:]]  # what the archive's cache inputs hold
    if long_prefill is not None:
        g = torch.Generator().manual_seed(seed + 1)
        ids = torch.randint(0, vocab, (1, long_prefill), generator=g)
        cases.append(_case(f"prefill S={long_prefill}", ids, layout.empty(0, dtype), run(ids, None), logits))
    return cases


def kept_positions(length: int) -> torch.Tensor:
    """The positions a ``logits="keep"`` check keeps: the last ``(length + 1) // 2`` (K = 3 of a
    6-token prefill, 2 of 3, 1 of a decode step)."""
    return torch.arange(length // 2, length)


def _case(label: str, ids: torch.Tensor, past: list[torch.Tensor], out: Any, logits: str) -> Case:
    """The graph's inputs (``ids``, ``past``) and what HF returned for them (``out``)."""
    keep = [kept_positions(ids.shape[1])] if logits == "keep" else []
    scores = out.logits[:, -1:, :] if logits == "last" else out.logits
    if keep:
        scores = scores.index_select(1, keep[0])
    present = [t.detach().clone() for t in cache_tensors(present_cache(out))]
    return Case(label, [ids, *past, *keep], [scores.detach().clone(), *present])


def _runner(model: nn.Module, weights: dict[str, torch.Tensor] | None) -> Any:
    if weights is None:
        return lambda ids, cache: hf_forward(model, ids, cache)
    # every name of a tied parameter, untied: the embedding and the LM head may be stored apart
    params = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers()) | weights

    def run(ids: torch.Tensor, cache: Any) -> Any:
        from transformers.cache_utils import DynamicCache

        from torchlower.llm.wrapper import cache_arg

        options = {"input_ids": ids, "use_cache": True, cache_arg(model): cache or DynamicCache()}
        with torch.no_grad():
            return torch.func.functional_call(model, params, (), options, tie_weights=False)

    return run


SAMPLE_FILES = ("io/prompt.npz", "io/prompt_with_past.npz", "io/decode_step.npz")


def samples(
    model: nn.Module,
    layout: Any,
    vocab: int,
    logits: str,
    weights: dict[str, torch.Tensor] | None,
    dtype: torch.dtype = torch.float32,
    cases: Any = reference_cases,
    names: tuple[str, ...] = SAMPLE_FILES,
) -> dict[str, bytes]:
    """``io/*.npz`` for any runtime to self-test: prompt, prompt-with-past, and a decode step
    (``cases`` computes them: a state-space model has its own, ``ssm_checks``).

    Each file holds the graph inputs and the expected outputs under their graph names.
    """
    out: dict[str, bytes] = {}
    for name, case in zip(names, cases(model, layout, vocab, logits, weights, dtype=dtype), strict=True):
        arrays: dict[str, np.ndarray] = {}
        for key, t in zip(layout.input_names(logits), case.inputs, strict=True):
            arrays[key] = t.numpy()
        for key, t in zip(layout.output_names(), case.outputs, strict=True):
            arrays[key] = t.numpy()
        out[name] = npz(arrays)
    if weights is None:  # greedy tokens of HF generate (the dequantized model has no generate)
        prompt = reference_inputs(vocab)[0]
        with torch.no_grad():
            tokens = model.generate(
                prompt, max_new_tokens=GENERATED, do_sample=False, min_new_tokens=GENERATED
            )
        out["io/generation.npz"] = npz({"input_ids": prompt.numpy(), "tokens": tokens[:, PROMPT:].numpy()})
    return out


def reference_inputs(vocab: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, vocab, (1, PROMPT), generator=g)
    more = torch.randint(0, vocab, (1, CONTINUATION), generator=g)
    step = torch.randint(0, vocab, (1, 1), generator=g)
    return prompt, more, step

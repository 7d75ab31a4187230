"""Reference cases of a state-space LM export, computed by Hugging Face itself.

HF's Mamba runs a prefill from zero states and one-token updates after it (its prefill of S > 1
tokens ignores a previous SSM state), so the cases are a 6-token prefill and two decode steps,
each with HF's own cache; a 3-token continuation from the prefill's states is compared with HF's
prefill of all 9 tokens (the same last logits and states, had the graph started from zero).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from torchlower.llm import checks
from torchlower.llm.checks import Case, reference_inputs
from torchlower.llm.ssm import StateLayout, hf_forward, hf_states
from torchlower.llm.wrapper import present_cache


def reference_cases(
    model: nn.Module,
    layout: StateLayout,
    vocab: int,
    logits: str,
    weights: dict[str, torch.Tensor] | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
) -> list[Case]:
    """Prefill (zero states), decode, decode, and a continuation checked against a longer prefill."""
    prompt, more, step = reference_inputs(vocab, seed)
    run = _runner(model, weights)
    cases: list[Case] = []
    out = run(prompt, None)
    cases.append(_case("prefill", prompt, layout.empty(0, dtype), out, logits))
    after_prompt = [t.to(dtype) for t in cases[0].outputs[1:]]
    cache = present_cache(out)
    past = after_prompt
    for start, label, ids in ((6, "decode after 6", step), (7, "decode after 7", more[:, :1])):
        out = run(ids, cache, start)
        cache = present_cache(out)
        cases.append(_case(label, ids, past, out, logits))
        past = [t.to(dtype) for t in cases[-1].outputs[1:]]
    whole = run(torch.cat([prompt, more], dim=1), None)
    cases.append(_case("continuation of 3 after 6", more, after_prompt, whole, logits))
    return cases


SAMPLE_FILES = ("io/prompt.npz", "io/decode_step.npz", "io/decode_step_2.npz", "io/continuation.npz")


def samples(
    model: nn.Module,
    layout: StateLayout,
    vocab: int,
    logits: str,
    weights: dict[str, torch.Tensor] | None,
    dtype: torch.dtype = torch.float32,
) -> dict[str, bytes]:
    """``checks.samples`` with this module's cases: prompt, two decode steps, a continuation."""
    return checks.samples(model, layout, vocab, logits, weights, dtype, reference_cases, SAMPLE_FILES)


def _case(label: str, ids: torch.Tensor, past: list[torch.Tensor], out: Any, logits: str) -> Case:
    scores = out.logits[:, -1:, :] if logits == "last" else out.logits[:, -ids.shape[1] :, :]
    return Case(label, [ids, *past], [scores.detach().clone(), *hf_states(present_cache(out))])


def _runner(model: nn.Module, weights: dict[str, torch.Tensor] | None) -> Any:
    """``(ids, cache, start)`` → HF's output, with the dequantized ``weights`` swapped in if given."""
    if weights is None:
        return lambda ids, cache, start=0: hf_forward(model, ids, cache, start)
    params = dict(model.named_parameters(remove_duplicate=False)) | dict(model.named_buffers()) | weights

    def run(ids: torch.Tensor, cache: Any, start: int = 0) -> Any:
        call = lambda **options: torch.func.functional_call(model, params, (), options, tie_weights=False)  # noqa: E731
        return hf_forward(model, ids, cache, start, call)

    return run

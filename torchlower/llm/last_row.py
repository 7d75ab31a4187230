"""With ``logits="last"``, the last layer's empty-row guard goes, so tract computes one query row there.

``rules/attention.py`` follows every masked ``scaled_dot_product_attention`` with
``select(row_alive, out, 0.0)``: a query row whose mask attends to nothing gives 0, as torch
does. In an LLM export the wrapper builds the mask (``CachedCausalLM._mask``: causal, or causal
within a sliding window), and query position ``P + i`` always sees key ``P + i``, so no row is
empty and the guard is the identity. It is not free in the last layer: tract 0.23.9's ``Iff``
has no slice rule (core/src/ops/logic.rs implements no ``TypedOp::slice``), so the graph's
final cut to position ``S - 1`` stops at that ``select`` and the last layer's attention
product, its transposes and ``o_proj`` run for all ``S`` rows. Without it tract pulls the cut
up to ``p · v`` (``split-over-2.S+-1..S``): prefill of 128 tokens on the 16 M Llama, node sum
22.4 → 21.4 ms (bench/llm_profile.py, minimum of 5, load 5.9), decode unchanged.

The other layers keep their guard, by measurement: with none at all, tract 0.23.9 fuses the
mask add into every ``q · kᵀ`` (39-57 µs a layer instead of 10-13 at decode, P = 128).
Models whose own code builds the mask (ALiBi) are left alone.
"""

from __future__ import annotations

from typing import Any

import torch

from torchlower.core.values import Value
from torchlower.nnef import graph_edit as edit

# what may sit between the mask's row maximum and the ``gt`` that tests it
_MAX_CHAIN = ("max_reduce", "max_pool", "tract_core_cast", "reshape")


def drop_last_guard(builder: Any) -> bool:
    """Replace the last empty-row guard's ``select`` by its input; says whether one was found."""
    producers = edit.producers(builder)
    guards = [a for a in builder.assignments if _is_guard(a, producers)]
    if not guards:
        return False
    last = guards[-1]
    edit.substitute(builder, {last.outputs[0].name: last.args[1]})
    return True


def _is_guard(a: Any, producers: dict[str, Any]) -> bool:
    """``select(gt(max over the mask's last axis, lowest float), out, 0.0)``, as
    ``rules.attention._zero_empty_rows`` writes it (the max possibly widened to f64 by
    ``guards.wide_extrema`` and cast back)."""
    if a.op != "select" or len(a.args) != 3 or a.args[2] != 0.0 or not isinstance(a.args[0], Value):
        return False
    test = producers.get(a.args[0].name)
    if test is None or test.op != "gt" or len(test.args) != 2 or not isinstance(test.args[0], Value):
        return False
    if test.args[1] not in (torch.finfo(torch.float32).min, torch.finfo(torch.float16).min):
        return False
    node, seen_max = producers.get(test.args[0].name), False
    while node is not None and node.op in _MAX_CHAIN:
        seen_max |= node.op in ("max_reduce", "max_pool")
        src = node.args[0] if node.args else None
        node = producers.get(src.name) if isinstance(src, Value) else None
    return seen_max

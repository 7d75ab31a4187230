"""A speech decoder's LM head stored apart from its tied token table, for ``compress="q4_0"``.

(Without compression the f32 table stays stored twice, as the lookup's table and as the head's
``[1, vocab, hidden]`` copy: sharing it as a reshape of the table, as the causal-LM export's
``share_tied_table`` does, made tract 0.23.9 pack the 80 MB head at run time on every step at
whisper-tiny's shapes (``outputs.pack_a``, 86 ms of a step): it did not fold that reshape into
a constant, where it did at a 4000-token vocabulary.)

Whisper's ``proj_out`` shares its weight with ``embed_tokens``. Lowered as is, the matmul reads
a derived copy of the table (``[1, vocab, hidden]``, not the parameter itself), which the q4_0
pass leaves in f32: the step then reads the 80 MB f32 head of whisper-tiny's shapes every token,
the largest cost of a decode step in tract (~40 %). Giving the decoder part its own copy of the
head (a parameter of its own) lets the q4_0 pass pack it like any linear layer while the
embedding lookup keeps the f32 table, as the causal-LM export's default ``lm_head="q4_0"`` does.
The check's reference model is untied the same way (``part_export.dequantized_model``'s ``aliases``).
"""

from __future__ import annotations

import copy

from torch import nn


def untie_head(part: nn.Module, model: nn.Module) -> dict[int, str]:
    """Replace the head in ``part`` (the decoder part) by a copy with its own weight when
    ``model``'s output embedding is tied to its input embedding; returns the copy's weight id →
    the model's head parameter name (``{}`` when untied already)."""
    head, table = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or table is None or head.weight is not table.weight:
        return {}
    for name, child in part.named_children():
        if child is head:
            own = copy.deepcopy(head)
            own.weight = nn.Parameter(head.weight.detach().clone(), requires_grad=False)
            setattr(part, name, own)
            return {id(own.weight): _name_of(model, head)}
    return {}


def table_names(part: nn.Module, model: nn.Module) -> frozenset[str]:
    """The names ``part`` gives the token table: kept f32 under q4_0 (the causal-LM default,
    ``embeddings="f32"``: the table carries most of a small model's Q4_0 error)."""
    table = model.get_input_embeddings()
    if table is None:
        return frozenset()
    return frozenset(n for n, p in part.named_parameters(remove_duplicate=False) if p is table.weight)


def _name_of(model: nn.Module, module: nn.Module) -> str:
    return next(f"{n}.weight" for n, m in model.named_modules() if m is module)

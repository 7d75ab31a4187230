"""Q4_0 for an LLM: linear layers in 4-bit blocks; the embedding table and LM head chosen apart.

The two tables hold most of a small model's bytes and carry most of its Q4_0 error (one row per
token, read directly into the logits), so each has its own storage option, as the reference
exporter allows. Roles are assigned by use in the graph, not by parameter name: the variable a
``tract_core_gather`` reads is the *embedding*, a variable holding the same table that a
``matmul`` reads is the *LM head*. A tied embedding (one HF parameter) is two variables in the
graph already (the matmul reads it reshaped), so the two roles can be stored apart there too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torchlower.core import progress
from torchlower.nnef import quant, text


@dataclass(frozen=True)
class Table:
    """A graph variable holding the token embedding or LM head table."""

    role: str  # "embeddings" | "lm_head"
    name: str  # the HF parameter name the role reads (``lm_head.weight``, ``model.embed_tokens.weight``)
    param: torch.Tensor


def tables(builder: Any, wrapper: nn.Module) -> dict[str, Table]:
    """Variable label → table, for the variables that hold the embedding or LM head."""
    model = wrapper.model  # type: ignore[attr-defined]
    names = {id(p): n for n, p in model.named_parameters(remove_duplicate=False)}
    found: dict[str, Table] = {}
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    roles = [("embeddings", embed), ("lm_head", head)]
    params = {role: m.weight for role, m in roles if m is not None}
    own = {role: _param_name(model, m) for role, m in roles if m is not None}
    for label, use_ops in _variable_uses(builder).items():
        weight = builder.weights.get(label)
        if not isinstance(weight, torch.Tensor) or not weight.is_floating_point():
            continue
        role = "embeddings" if "tract_core_gather" in use_ops else "lm_head" if "matmul" in use_ops else None
        param = params.get(role) if role else None
        if (
            param is None
            or weight.numel() != param.numel()
            or not quant.same_tensor(weight.reshape(param.shape), param.detach())
        ):
            continue
        found[label] = Table(role, own.get(role) or names[id(param)], param)  # type: ignore[arg-type]
    return found


def compress_weights(
    builder: Any,
    wrapper: nn.Module,
    compress: str | None,
    storage: dict[str, str],
    keep: bool = True,
    release: Callable[[torch.Tensor], None] | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Pack the chosen weights as Q4_0; returns the dequantized HF parameters (for the check)
    and the weights asked for that stayed float, with the reason.

    ``storage`` maps each table role to ``f32`` / ``f16`` / ``q4_0``. One parameter at a time,
    so a memory-mapped checkpoint is read, packed and released tensor by tensor; with
    ``keep=False`` (no check) nothing is packed here: the archive writer packs each tensor as
    it writes it (``quant.DeferredBlocks``) and no dequantized copy is made.
    """
    found = tables(builder, wrapper)
    table_params = {id(t.param) for t in found.values()}
    chosen: dict[str, tuple[str, torch.Tensor]] = {}  # label → (HF name, parameter)
    for label, table in found.items():
        if storage[table.role] == "q4_0":
            chosen[label] = (table.name, table.param)
    if compress == "q4_0":
        for label, param in wrapper.named_parameters():
            if id(param) not in table_params and param.dim() >= 2:
                chosen[label] = (label.removeprefix("model."), param)
    dequantized: dict[str, torch.Tensor] = {}
    with progress.stage("packing q4_0", total=len(chosen), unit="tensors"):
        for label, (name, param) in chosen.items():
            packed = quant.compress_weights(builder, quant.Q4_0, {label: param}, release, keep)
            for values in packed.values() if keep else ():  # one entry, none when left float
                dequantized[name] = values
            progress.advance(1)
    return dequantized, _left_float(builder, chosen)


def _left_float(builder: Any, chosen: dict[str, tuple[str, torch.Tensor]]) -> dict[str, str]:
    """HF name → why a weight chosen for Q4_0 is still float in the archive."""
    live = {a.attrs["label"] for a in builder.live_assignments() if a.op.startswith("variable")}
    left: dict[str, str] = {}
    for label, (name, param) in chosen.items():
        weight = builder.weights.get(label)
        if isinstance(weight, quant.BlockQuantized):
            continue
        if label not in live:
            left[name] = "not stored as itself (folded into a derived constant)"
        elif quant.batched(param.shape):
            left[name] = "one matrix per expert (tract packs Q4_0 weights only as [1.., M, K])"
        elif int(param.shape[-1]) % quant.BLOCK:
            left[name] = f"reduced size {int(param.shape[-1])} is not a multiple of {quant.BLOCK}"
        else:
            left[name] = "used by an op other than matmul / conv / gather"
    return left


def store_f16(builder: Any, wrapper: nn.Module, roles: set[str]) -> dict[str, torch.Tensor]:
    """Tables of ``roles`` stored as f16 in an f32 graph, cast back where they are read.

    tract folds the cast when it loads the archive, so this halves the file, not the memory.
    Returns the f16-rounded HF parameters (what the check runs PyTorch with).
    """
    from torchlower.core.values import Value

    found = {label: t for label, t in tables(builder, wrapper).items() if t.role in roles}
    rounded: dict[str, torch.Tensor] = {}
    for a in list(builder.assignments):
        label = a.attrs.get("label") if a.op.startswith("variable") else None
        weight = builder.weights.get(label) if label in found else None
        if not isinstance(weight, torch.Tensor) or weight.dtype != torch.float32:
            continue
        builder.weights[label] = weight.half()
        out = a.outputs[0]
        stored = Value(builder.fresh(f"{out.name}_f16"), torch.float16, out.shape, label=label)
        a.outputs = [stored]
        cast = text.Assignment([out], "tract_core_cast", [stored], {"to": "f32"})
        builder.assignments.insert(builder.assignments.index(a) + 1, cast)
        table = found[label]
        rounded[table.name] = weight.half().float().reshape(table.param.shape)
    return rounded


def _variable_uses(builder: Any) -> dict[str, set[str]]:
    """Label of each live variable → the ops that read it."""
    live = builder.live_assignments()
    labels = {a.outputs[0].name: a.attrs["label"] for a in live if a.op.startswith("variable")}
    uses: dict[str, set[str]] = {label: set() for label in labels.values()}
    for a in live:
        if a.op.startswith("variable"):
            continue
        for arg in quant.flat_items(a.args) + quant.flat_items(list(a.attrs.values())):
            name = getattr(arg, "name", None)
            if name in labels:
                uses[labels[name]].add(a.op)
    return uses


def _param_name(model: nn.Module, module: nn.Module) -> str | None:
    for name, m in model.named_modules():
        if m is module:
            return f"{name}.weight" if name else "weight"
    return None


def share_tied_table(builder: Any, wrapper: nn.Module) -> tuple[str, str] | None:
    """A tied embedding stored once: the LM head's variable becomes a reshape of the table's.

    The matmul reads the table with a leading 1 (``[1, vocab, hidden]``), a second variable
    holding the same numbers; unless the two are stored apart (``lm_head`` ≠ ``embeddings``)
    the archive would carry the table twice. tract folds the reshape of a constant at load.
    Returns the HF names of the table and the head (one stored tensor), or None.
    """
    found = tables(builder, wrapper)
    by_role = {t.role: (label, t) for label, t in found.items()}
    if (
        set(by_role) != {"embeddings", "lm_head"}
        or by_role["embeddings"][1].param is not by_role["lm_head"][1].param
    ):
        return None
    (table, embed), (head, lm_head) = by_role["embeddings"], by_role["lm_head"]
    first, second = builder.weights[table], builder.weights[head]
    if not (
        isinstance(first, torch.Tensor) and isinstance(second, torch.Tensor) and first.dtype == second.dtype
    ):
        return None  # stored apart (one of them packed or halved)
    variables = {
        a.attrs.get("label"): i for i, a in enumerate(builder.assignments) if a.op.startswith("variable")
    }
    at, later = variables.get(table), variables.get(head)
    if at is None or later is None or at > later:
        return None
    source, old = builder.assignments[at], builder.assignments[later]
    out = old.outputs[0]
    builder.assignments[later] = text.Assignment(
        [out], "reshape", [source.outputs[0]], {"shape": list(out.shape)}, old.scope
    )
    return embed.name, lm_head.name

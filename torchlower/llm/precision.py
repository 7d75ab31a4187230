"""f16 exports keep the KV cache in f16 at the graph boundary, as tract's runner expects.

The wrapper converts the f16 cache inputs to the model's dtype and the new caches back to
f16 (so the traced torch program is well typed). Under ``precision="f16"`` the builder
computes in f16 anyway, so both conversions become casts from f16 to f16; they are removed
here because tract's ``detect_kv_cache`` only recognizes ``input → concat → output`` with
nothing in between (transformers/src/ops/dyn_kv_cache.rs, ``replace_kv_cache``).
"""

from __future__ import annotations

from typing import Any

import torch

from torchlower.core.values import Value
from torchlower.llm.ssm_mixers import MIXERS
from torchlower.nnef import graph_edit as edit
from torchlower.nnef import text

F16_MAX, F16_TINY = 65504.0, 2.0**-14  # largest f16, smallest normal f16
_STORED = {"BF16": "bfloat16", "F16": "float16", "F64": "float64"}


def conversion_notes(stored: tuple[str, ...], precision: str, model: Any) -> list[str]:
    """What the export did to checkpoint weights stored in another float format than f32.

    transformers loads them as f32 (bfloat16 and float16 widen exactly); an f16 export then
    rounds each to float16, which bfloat16's wider exponent can overflow or underflow.
    """
    notes = []
    for kind in stored:
        name = _STORED.get(kind)
        if name is None:
            continue
        widened = "exact" if kind in ("BF16", "F16") else "rounded to f32"
        if precision == "f32" or kind == "F16":
            notes.append(f"checkpoint weights stored as {name}; exported as {precision} ({widened})")
            continue
        big = tiny = 0
        with torch.no_grad():
            for p in model.parameters():
                if p.is_floating_point() and p.device.type != "meta":
                    magnitude = p.detach().abs()
                    big += int((magnitude > F16_MAX).sum())
                    tiny += int(((magnitude < F16_TINY) & (magnitude > 0)).sum())
        notes.append(
            f"checkpoint weights stored as {name}; exported as f16: rounded from {name} to float16 "
            f"(11 significant bits, range ±{F16_MAX:g}): {big} weight(s) beyond that range become inf, "
            f"{tiny} below {F16_TINY:.2g} lose precision as f16 subnormals"
        )
    return notes


def cache_dtype(precision: str) -> torch.dtype:
    return torch.float16 if precision == "f16" else torch.float32


def drop_cache_casts(builder: Any) -> int:
    """Remove the f16→f16 casts between cache inputs, their concat and the cache outputs."""
    producers = {a.outputs[0].name: a for a in builder.assignments if len(a.outputs) == 1}
    f16_inputs = {v.name for v in builder.inputs if v.dtype == torch.float16}
    renames: dict[str, Value] = {}
    for a in builder.assignments:
        if _f16_cast(a) and a.args[0].name in f16_inputs:
            renames[a.outputs[0].name] = a.args[0]
    edit.substitute(builder, renames)
    outputs = []
    for name, value in builder.outputs:
        cast = producers.get(value.name)
        if cast is not None and _f16_cast(cast):
            inner = producers.get(cast.args[0].name)
            if inner is not None and inner.op == "concat":
                value = cast.args[0]
                renames[name] = value
        outputs.append((name, value))
    builder.outputs = outputs
    return len(renames)


def _f16_cast(a: Any) -> bool:
    return (
        a.op == "tract_core_cast" and a.attrs.get("to") == "f16" and a.args and isinstance(a.args[0], Value)
    )


F32_PARTS = ("attention", "norms", "lm_head")
DEFAULT_F32_PARTS = ("attention", "norms")


def keep_f32(builder: Any, wrapper: Any, parts: tuple[str, ...]) -> int:
    """In an f16 export, run the ops of the chosen ``parts`` in f32; returns how many ops.

    ``attention``: the ops written in an attention module's own scope (scores, mask, softmax,
    the product with V, rotary; its projections are separate modules and stay f16);
    ``norms``: the ops of every ``*Norm`` module (an f16 mean of squares overflows once
    activations pass 256); ``lm_head``: the output projection (tract then holds that weight
    in f32: twice its memory). Values entering a part are cast to f32, values leaving it back
    to f16; weights stay f16 in the file (tract folds their cast when it loads). Graph outputs
    (the cache concats) are never inside a part, so ``detect_kv_cache`` still matches.
    """
    scopes = _part_scopes(wrapper, parts)
    if not scopes:
        return 0
    outputs = {v.name for _, v in builder.outputs}
    region = [
        a
        for a in builder.assignments
        if a.scope in scopes
        and not a.op.startswith("variable")
        and not any(v.name in outputs for v in a.outputs)
    ]
    inside = {v.name for a in region for v in a.outputs}
    members = {id(a) for a in region}
    casts: dict[tuple[str, str], Value] = {}
    result: list[Any] = []
    for a in builder.assignments:
        member = id(a) in members
        if member and a.op == "tract_core_cast" and a.attrs.get("to") == "f16":
            a.attrs["to"] = "f32"  # a rule's own accurate/compute pair, now all f32
        elif not member and a.op == "tract_core_cast" and a.attrs.get("to") == "f32":
            result.append(a)  # already leaves in f32 (the logits output)
            continue
        wanted = "f32" if member else "f16"
        crossing = [
            v for v in _values(a.args) if (v.name in inside) != member and not v.is_const and _is_float(v)
        ]
        for v in crossing:
            if (v.name, wanted) not in casts:
                cast = Value(builder.fresh(f"{v.name}_{wanted}"), v.dtype, v.shape)
                result.append(text.Assignment([cast], "tract_core_cast", [v], {"to": wanted}, a.scope))
                casts[(v.name, wanted)] = cast
        if crossing:
            swap = {v.name: casts[(v.name, wanted)] for v in crossing}
            a.args = [_map(x, swap) for x in a.args]
        result.append(a)
    builder.assignments = result
    return len(region)


def _part_scopes(wrapper: Any, parts: tuple[str, ...]) -> set[str]:
    scopes = set()
    head = wrapper.model.get_output_embeddings()
    for path, module in wrapper.named_modules():
        kind = type(module).__name__
        # a state-space layer's mixer is its attention: the convolution, discretization and scan
        attention = "attention" in parts and (kind.endswith("Attention") or kind in MIXERS)
        norm = "norms" in parts and "Norm" in kind
        if attention or norm or ("lm_head" in parts and head is not None and module is head):
            scopes.add(path)
    return scopes


def _is_float(v: Value) -> bool:
    return v.dtype is not None and v.dtype.is_floating_point


def _values(items: Any) -> list[Value]:
    if isinstance(items, Value):
        return [items]
    if isinstance(items, (list, tuple)):
        return [v for i in items for v in _values(i)]
    return []


def _map(item: Any, swap: dict[str, Value]) -> Any:
    if isinstance(item, Value):
        return swap.get(item.name, item)
    if isinstance(item, (list, tuple)):
        return type(item)(_map(i, swap) for i in item)
    return item

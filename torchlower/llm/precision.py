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

from torchlower.nnef import passes
from torchlower.values import Value


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
    passes._substitute(builder, renames)
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

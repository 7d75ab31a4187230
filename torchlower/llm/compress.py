"""Q4_0 for an LLM: linear layers in 4-bit blocks, the embedding table and LM head chosen apart.

The token embedding and the LM head carry most of a small model's error under Q4_0 (one row
per token, read directly into the logits), so ``embeddings=`` decides them separately, as the
reference exporter allows. A tied embedding (one tensor used as both gather table and matmul
weight) has two kinds of use and stays as it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from torchlower import progress
from torchlower.nnef import quant


def embedding_labels(wrapper: nn.Module) -> set[str]:
    """Parameter names (labels) of the input embedding and the LM head in the wrapper."""
    model = wrapper.model  # type: ignore[attr-defined]
    tables = [
        m.weight for m in (model.get_input_embeddings(), model.get_output_embeddings()) if m is not None
    ]
    ids = {id(t) for t in tables}
    return {name for name, p in wrapper.named_parameters(remove_duplicate=False) if id(p) in ids}


def compress_weights(
    builder: Any,
    wrapper: nn.Module,
    compress: str | None,
    embeddings: str,
    keep: bool = True,
    release: Callable[[torch.Tensor], None] | None = None,
) -> dict[str, torch.Tensor]:
    """Pack the chosen weights as Q4_0; returns the dequantized HF parameters (for the check).

    One parameter at a time, so a memory-mapped checkpoint is read, packed and released tensor
    by tensor; with ``keep=False`` (no check) nothing is packed here: the archive writer packs
    each tensor as it writes it (``quant.DeferredBlocks``) and no dequantized copy is made.
    """
    params = dict(wrapper.named_parameters())
    tables = embedding_labels(wrapper)
    dequantized: dict[str, torch.Tensor] = {}
    chosen = {
        label: param
        for label, param in params.items()
        if (embeddings == "q4_0" if label in tables else compress == "q4_0")
    }
    with progress.stage("packing q4_0", total=len(chosen), unit="tensors"):
        for label, param in chosen.items():
            packed = quant.compress_weights(builder, quant.Q4_0, {label: param}, release, keep)
            if keep:
                dequantized.update({k.removeprefix("model."): v for k, v in packed.items()})
            progress.advance(1)
    return dequantized


def store_f16(builder: Any, wrapper: nn.Module) -> dict[str, torch.Tensor]:
    """The embedding table and LM head stored as f16 in an f32 graph, cast back where they are read.

    tract folds the cast when it loads the archive, so this halves the file, not the memory.
    Returns the f16-rounded HF parameters (what the check runs PyTorch with).
    """
    from torchlower.nnef import text
    from torchlower.values import Value

    tables = embedding_labels(wrapper)
    rounded: dict[str, torch.Tensor] = {}
    for a in list(builder.assignments):
        label = a.attrs.get("label") if a.op.startswith("variable") else None
        weight = builder.weights.get(label) if label in tables else None
        if not isinstance(weight, torch.Tensor) or weight.dtype != torch.float32:
            continue
        builder.weights[label] = weight.half()
        out = a.outputs[0]
        stored = Value(builder.fresh(f"{out.name}_f16"), torch.float16, out.shape, label=label)
        a.outputs = [stored]
        cast = text.Assignment([out], "tract_core_cast", [stored], {"to": "f32"})
        builder.assignments.insert(builder.assignments.index(a) + 1, cast)
        param = wrapper.get_parameter(label)
        rounded[label.removeprefix("model.")] = weight.half().float().reshape(param.shape)
    return rounded

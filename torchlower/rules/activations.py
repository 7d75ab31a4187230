"""Pointwise activations."""

from __future__ import annotations

from torchlower.rules import rule
from torchlower.rules.common import Builder
from torchlower.values import Value


@rule("aten::relu", "aten::relu_")
def relu(b: Builder, x: Value) -> Value:
    """relu(Tensor self) -> Tensor"""
    return b.call("relu", [x], dtype=x.dtype, shape=x.shape)

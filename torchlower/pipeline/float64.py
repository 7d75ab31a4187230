"""The float64 judge of the check: a point where tract and torch-f32 disagree beyond tolerance
is evaluated again in float64 PyTorch, and tract is held to float64 (``comparison.judge``).

The model is never touched: a deep copy is cast to float64 (parameters and float buffers),
with the dequantized weights of a compressed export cast as well, and run with float64 as the
default dtype (``torch.zeros(n)`` inside ``forward`` is float64 too). A model that cannot run
so (an explicit ``.float()`` meeting a float64 tensor, a kernel without float64) is said so on
every output judged at that point.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import nn

from torchlower.core import model_io

Reference = Callable[[Sequence[torch.Tensor]], tuple[list[torch.Tensor], list[torch.Tensor]]]


def reference(module: nn.Module, params: dict[str, torch.Tensor] | None = None) -> Reference:
    """``module`` (with ``params`` replaced, if given) as a fresh deep copy per call, run first
    as it is and then cast to float64: ``(float32 outputs, float64 outputs)``. The first must
    reproduce the check's own reference bit for bit, else the model is not a function of its
    inputs (state, randomness) and its float64 distance says nothing about rounding."""

    def run(inputs: Sequence[torch.Tensor]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        copied = copy.deepcopy(module)
        same = model_io.flatten_outputs(_call(copied, params, tuple(inputs)))
        wide = copied.double()
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            widened = {k: widen(v) for k, v in params.items()} if params else None
            out = model_io.flatten_outputs(_call(wide, widened, tuple(widen(t) for t in inputs)))
        finally:
            torch.set_default_dtype(default)
        return same, out

    return run


def _call(
    module: nn.Module, params: dict[str, torch.Tensor] | None, inputs: tuple[torch.Tensor, ...]
) -> object:
    return torch.func.functional_call(module, params, inputs) if params else module(*inputs)


def widen(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.is_floating_point() else t

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

Reference = Callable[[Sequence[torch.Tensor]], list[torch.Tensor]]


def reference(module: nn.Module, params: dict[str, torch.Tensor] | None = None) -> Reference:
    """``module`` (with ``params`` replaced, if given) in float64, copied on first use."""
    wide: list[nn.Module] = []

    def run(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if not wide:
            wide.append(copy.deepcopy(module).double())
        ins = tuple(widen(t) for t in inputs)
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            if params:
                out = torch.func.functional_call(wide[0], {k: widen(v) for k, v in params.items()}, ins)
            else:
                out = wide[0](*ins)
        finally:
            torch.set_default_dtype(default)
        return model_io.flatten_outputs(out)

    return run


def widen(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.is_floating_point() else t

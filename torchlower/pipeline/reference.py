"""Stage 2, run the model: PyTorch on the example gives the outputs to check against, their
names, and (under dynamic axes) which check sizes the model itself refuses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from torchlower.core import model_io
from torchlower.errors import InvalidArgumentError, TorchlowerError
from torchlower.nnef.builder import NNEFBuilder
from torchlower.pipeline.request import Request


@dataclass(frozen=True)
class Reference:
    """The model as it runs in PyTorch (an eval view: the user's model is never touched)."""

    module: nn.Module
    expected: list[torch.Tensor]
    output_names: list[str]


def run_reference(model: nn.Module, req: Request, output_names: Sequence[str] | None) -> Reference:
    module = model_io.eval_view(model)
    try:
        with torch.no_grad(), model_io.state_kept(module):  # the trace sees the model as given
            returned = module(*req.example)
        expected = model_io.flatten_outputs(returned)
    except TorchlowerError:
        raise
    except Exception as exc:  # the model itself refuses the example: bad input, say so
        raise InvalidArgumentError(
            f"{type(model).__name__} fails on the example inputs"
            f" ({', '.join(f'{list(t.shape)} {t.dtype}' for t in req.example)}):"
            f" {type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        ) from exc
    names_out = model_io.output_names(expected, output_names, returned)
    if req.spec is not None:  # check sizes the model itself refuses are skipped (and reported)
        with model_io.state_kept(module):
            req.spec.probe(lambda inputs: module(*inputs), req.example)
    return Reference(module, expected, names_out)


def unrun(model: nn.Module, output_names: Sequence[str]) -> Reference:
    """The reference of an export that is not checked: the model never runs (a memory-mapped
    checkpoint stays on disk, no probe of check sizes); ``graph_outputs`` fills the outputs'
    shapes and dtypes from the lowered graph, for the report."""
    return Reference(model_io.eval_view(model), [], list(output_names))


def graph_outputs(ref: Reference, builder: NNEFBuilder) -> Reference:
    """``ref`` with the lowered graph's outputs as meta tensors: their dtypes and ranks (a
    symbolic size stands as 1; the report shows the graph's symbolic shape)."""
    expected = [
        torch.empty(
            [d if isinstance(d, int) else 1 for d in v.shape or ()],
            dtype=v.dtype or torch.float32,
            device="meta",
        )
        for _, v in builder.outputs
    ]
    return Reference(ref.module, expected, ref.output_names)


def fake_run(module: nn.Module, example: Sequence[torch.Tensor]) -> object:
    """``module(*example)`` on fake tensors: outputs with their shapes and dtypes, no data (no
    weight read, no arithmetic).

    Attributes the run sets are put back, and new tensor attributes (a fake rotary table)
    removed; other new attributes stay, since what they record outlives the run (transformers'
    ``_output_capturing_hooks_installed`` flags the hooks its first call registers: removing it
    would register them twice on the next call)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    saved = [(m, dict(vars(m))) for m in module.modules()]
    try:
        with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True) as mode:
            return module(*[mode.from_tensor(t) for t in example])
    finally:
        for m, attrs in saved:
            for key, value in list(vars(m).items()):
                if key in attrs and attrs[key] is not value:
                    object.__setattr__(m, key, attrs[key])
                elif key not in attrs and isinstance(value, torch.Tensor):
                    delattr(m, key)

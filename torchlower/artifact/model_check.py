"""``check(path, model=...)``: compare an archive with a PyTorch model the way ``export`` did.

So that export and check give the same verdict for the same file and model:

- the inputs are the given (or drawn) ones **and** ``verification.RANDOM_POINTS`` fresh inputs
  resembling them, every point reported;
- a compressed archive (Q4_0 weights) is compared with the model running the archive's
  dequantized weights — after proving that each such weight is exactly the model's parameter
  quantized (else the archive holds other weights and the plain model is the reference) — and
  the error against the original model is reported beside it;
- an f16 archive (f16 weights or compute) gets the f16 tolerance, as at export.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchlower.core import model_io
from torchlower.core import tolerance as tolerances
from torchlower.errors import InvalidArgumentError
from torchlower.nnef import quant
from torchlower.pipeline import float64, verification


@dataclass
class Reference:
    """What the archive is compared with, in words for the report."""

    comparison: str  # "model", "model with the archive's dequantized q4_0 weights (2 tensors)"
    params: dict[str, torch.Tensor]  # parameters replaced for the comparison (empty: plain model)


def reference(art: Any, model: torch.nn.Module) -> Reference:
    """The model as ``export`` checked it: block-quantized weights replaced by their dequantized
    values when they are exactly the model's parameters quantized."""
    blocks = [label for label, fmt in art.formats.items() if fmt in quant.FORMATS]
    if not blocks:
        return Reference("model", {})
    own = dict(model.named_parameters()) | dict(model.named_buffers())
    params: dict[str, torch.Tensor] = {}
    for label in blocks:
        fmt = quant.FORMATS[art.formats[label]]
        stored = art.weights[label]
        param = own.get(label)
        found = _as_quantized(fmt, stored, param) if param is not None else None
        if found is None:
            return Reference(
                f"model (the archive's {fmt.name} weight {label!r} is not the model's parameter"
                " quantized, so the dequantized model cannot be rebuilt)",
                {},
            )
        params[label] = found
    names = sorted({art.formats[b] for b in blocks})
    return Reference(
        f"model with the archive's dequantized {'/'.join(names)} weights ({len(params)} tensors),"
        " as export checks; error against the original model in original_errors",
        params,
    )


def _as_quantized(fmt: quant.BlockFormat, stored: np.ndarray, param: torch.Tensor) -> torch.Tensor | None:
    """``param`` dequantized as stored (reshaped, or transposed for ``x @ W``), if it is that."""
    p = param.detach().float()
    candidates = []
    if p.numel() == stored.size:
        candidates.append((p.reshape(stored.shape), lambda v: v.reshape(param.shape)))
    if p.dim() == 2 and tuple(p.shape[::-1]) == stored.shape:
        candidates.append((p.t().contiguous(), lambda v: v.t().reshape(param.shape)))
    for c, back in candidates:
        if not quant.can_block_quantize(tuple(c.shape)):
            continue
        values = quant.quantize(fmt, c.numpy()).dequantize()
        if np.array_equal(values, stored):
            return back(torch.from_numpy(values)).to(param.dtype)
    return None


def is_f16(art: Any) -> bool:
    """An archive exported with ``precision="f16"``: f16 weights or casts to f16 inside."""
    if any(fmt == "f16" for fmt in art.formats.values()):
        return True
    return any(a.op == "tract_core_cast" and a.attrs.get("to") == "f16" for a in art.graph.assignments)


@dataclass
class Result:
    points: list[verification.CheckPoint]
    original: list[verification.CheckPoint]
    outputs: list[np.ndarray]  # tract's outputs at the first point
    comparison: str


def check(
    folder: Path,
    target: Path,
    art: Any,
    inputs: list[np.ndarray],
    model: torch.nn.Module,
    tolerance: float | None,
) -> Result:
    """Run the archive at ``inputs`` and random inputs like them; compare as export does."""
    if not isinstance(model, torch.nn.Module):
        raise InvalidArgumentError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    module = model_io.eval_view(model)
    ref = reference(art, module)
    first = tuple(torch.from_numpy(np.array(x, copy=True)) for x in inputs)
    names = art.output_names
    steps = tolerances.quant_steps(art.quant)

    def tol(want: Sequence[np.ndarray]) -> float:
        if tolerance is not None:
            return tolerance
        return tolerances.f16(want) if is_f16(art) else tolerances.quantized(want, steps)

    def run(params: dict[str, torch.Tensor]) -> Any:
        def call(ins: Sequence[torch.Tensor]) -> list[torch.Tensor]:
            out = torch.func.functional_call(module, params, tuple(ins)) if params else module(*ins)
            return model_io.flatten_outputs(out)

        return call

    original = run({}) if ref.params else None
    drawn = verification.random_points(first, reference=run(ref.params))
    points = [verification.Point("given inputs", first), *drawn, *verification.special_point(first)]
    outcome = verification.check_points(
        folder, points, run(ref.params), names, tol, original, f"the {ref.comparison}", target,
        wide=float64.reference(module, ref.params),
    )  # fmt: skip
    return Result(outcome.points, outcome.original, outcome.first_outputs, ref.comparison)

"""Reference executor vs eager PyTorch: what ``save`` and ``check`` report for a lattice artifact.

A ✓ must not rest on the one example: besides it, ``save`` runs fresh random inputs of the same
structure (same kinds, channels, strides and value ranges, new voxels). Sparse outputs are
compared after sorting rows by ``(batch, x, y, z)``; their coordinates must agree exactly.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from torchlower.core import tolerance as tolerances
from torchlower.core.comparison import OutputError
from torchlower.errors import CheckError
from torchlower.lattice import quantize
from torchlower.lattice.sparse import SparseTensor

FRESH_ROWS = 256  # cap on the rows of a fresh sparse input: the reference executor is brute force


def fresh_inputs(examples: Sequence[Any], seed: int) -> tuple[Any, ...]:
    """Random inputs shaped like ``examples``: sparse inputs get new voxels in the example's
    coordinate range; float tensors new values in each column's range; integer tensors (batch
    indices, row counts, ids) a row permutation of the example's values."""
    gen = torch.Generator().manual_seed(seed)
    return tuple(_fresh(x, gen) for x in examples)


def _fresh(x: Any, gen: torch.Generator) -> Any:
    if isinstance(x, SparseTensor):
        return _fresh_sparse(x, gen)
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or x.shape[0] == 0:
        return x
    if x.is_floating_point():
        flat = x.reshape(x.shape[0], -1).float()
        lo, hi = flat.min(dim=0).values, flat.max(dim=0).values
        values = lo + (hi - lo) * torch.rand(flat.shape, generator=gen)
        return values.reshape(x.shape).to(x.dtype)
    return x[torch.randperm(x.shape[0], generator=gen)] if x.shape[0] > 1 else x.clone()


def _fresh_sparse(x: SparseTensor, gen: torch.Generator) -> SparseTensor:
    stride = torch.tensor(x.stride)
    logical = x.coords.long()
    logical[:, 1:] //= stride
    lo, hi = logical.min(dim=0).values, logical.max(dim=0).values
    rows = min(len(x.coords), FRESH_ROWS)
    span = hi - lo + 1
    offset = (torch.rand(rows, 4, generator=gen) * span.float()).long()
    cand = lo + torch.minimum(offset, span - 1)
    cand[:, 1:] *= stride
    coords = torch.unique(cand, dim=0).int()
    mean, std = x.feats.float().mean(dim=0), x.feats.float().std(dim=0).nan_to_num(1.0).clamp(min=1e-3)
    feats = (torch.randn(len(coords), x.num_channels, generator=gen) * std + mean).to(x.feats.dtype)
    return SparseTensor(feats, coords, x.stride)


def dequantized_copy(model: nn.Module, packed: dict[str, tuple[str, int, int, str]]) -> nn.Module:
    """``model`` with every packed weight (``key → (kind, bits, group, scale dtype)``) replaced by
    its quantize → dequantize image: what the artifact computes with. A copy; ``model`` stays."""
    if not packed:
        return model
    view = copy.deepcopy(model)
    with torch.no_grad():
        for key, (kind, bits, group, scale_dtype) in packed.items():
            param = view.get_parameter(key)
            parts = quantize.pack(param.detach().float(), kind, bits, group, scale_dtype)
            param.copy_(quantize.unpack(parts, tuple(param.shape), kind, bits).to(param.dtype))
    return view


def eager_outputs(model: nn.Module, inputs: Sequence[Any]) -> list[Any]:
    with torch.no_grad():
        out = model(*inputs)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def sorted_rows(x: SparseTensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Coordinates and features in ``(batch, x, y, z)`` order."""
    if len(x.coords) == 0:
        return x.coords, x.feats
    keys = x.coords.long()
    lo = keys.min(dim=0).values
    span = keys.max(dim=0).values - lo + 1
    flat = torch.zeros(len(keys), dtype=torch.long)
    for col in range(4):
        flat = flat * span[col] + (keys[:, col] - lo[col])
    order = torch.argsort(flat)
    return x.coords[order], x.feats[order]


def as_array(value: Any) -> np.ndarray:
    """The numbers of one output: a dense tensor as is, a sparse one's features in row order."""
    if isinstance(value, SparseTensor):
        return sorted_rows(value)[1].detach().float().numpy()
    return value.detach().float().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def compare(
    names: Sequence[str], eager: Sequence[Any], ran: Sequence[Any], tolerance: float | None
) -> list[OutputError]:
    """Per-output max abs / rel error of the reference executor against eager."""
    if len(eager) != len(ran):
        raise CheckError(f"the reference executor produced {len(ran)} outputs, PyTorch {len(eager)}")
    for name, e, r in zip(names, eager, ran, strict=True):
        if isinstance(e, SparseTensor) != isinstance(r, SparseTensor):
            raise CheckError(f"output {name!r}: sparse in one run, dense in the other")
        if isinstance(e, SparseTensor):
            ce, cr = sorted_rows(e)[0], sorted_rows(r)[0]
            if e.stride != r.stride or not torch.equal(ce, cr):
                raise CheckError(
                    f"output {name!r}: the reference executor's voxels ({len(cr)} at stride {r.stride})"
                    f" differ from PyTorch's ({len(ce)} at stride {e.stride})"
                )
    want, got = [as_array(e) for e in eager], [as_array(r) for r in ran]
    tol = tolerance if tolerance is not None else tolerances.default(want)
    errors = []
    for name, w, g in zip(names, want, got, strict=True):
        if w.shape != g.shape:
            raise CheckError(f"output {name!r}: reference shape {g.shape} != PyTorch shape {w.shape}")
        diff = np.abs(w.astype(np.float64) - g.astype(np.float64))
        diff = np.where(np.isnan(diff), np.inf, diff)
        max_abs = float(diff.max()) if diff.size else 0.0
        max_rel = float((diff / np.maximum(np.abs(w), 1e-12)).max()) if diff.size else 0.0
        errors.append(OutputError(name, max_abs, max_rel, tol))
    return errors


def raise_on_mismatch(errors: Sequence[OutputError], where: str) -> None:
    bad = [e for e in errors if not e.ok]
    if bad:
        detail = "; ".join(f"{e.name}: max abs {e.max_abs:.3g} > {e.tolerance:.3g}" for e in bad)
        raise CheckError(f"{where}: the reference executor disagrees with PyTorch — {detail}", list(errors))

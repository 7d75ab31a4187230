"""Random check inputs for models that invert matrices: drawn well-conditioned.

A matrix drawn at random is near singular often enough (a homography, a 3×3 covariance) that
``linalg.inv`` / ``solve`` / ``det`` amplify float32 rounding by its condition number, in torch
as in tract: the comparison then measures the draw, not the artifact. So when the model runs
one of these ops (seen by running it once at the example under a dispatch recorder), every
float input whose last two axes are square (n ≥ 2) is drawn diagonally dominant instead:
the drawn matrix plus, on its diagonal, the sign of that entry times the row's absolute sum
plus its spread — condition number a few units. The point's label says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

Reference = Callable[[Sequence[torch.Tensor]], list[torch.Tensor]]

# ATen ops (by name) whose result is as conditioned as the matrix they are given
INVERTING = ("linalg_inv", "linalg_solve", "linalg_det", "linalg_slogdet", "linalg_lu", "lu_solve",
             "triangular_solve", "cholesky", "linalg_pinv", "linalg_lstsq")  # fmt: skip


class _Seen(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        name = str(func).split(".")[1].lstrip("_")
        if any(name.startswith(op) for op in INVERTING):
            self.ops.add(name)
        return func(*args, **(kwargs or {}))


def inverting_ops(reference: Reference, example: Sequence[torch.Tensor]) -> list[str]:
    """The matrix-inverting ATen ops ``reference`` runs at ``example`` (none: an empty list).
    Runs on copies, without grad, with the RNG state put back."""
    seen = _Seen()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]), seen:
            reference([t.clone() for t in example])
    except Exception:  # the check proper reports what fails at the example
        return []
    return sorted(seen.ops)


def is_square(t: torch.Tensor) -> bool:
    return t.is_floating_point() and t.dim() >= 2 and t.shape[-1] == t.shape[-2] >= 2


def well_conditioned(drawn: torch.Tensor) -> torch.Tensor:
    """``drawn`` (square in its last two axes) made diagonally dominant, same dtype."""
    m = drawn.double()
    spread = float(m.std()) if m.numel() > 1 else 1.0
    spread = spread if spread > 0 else 1.0
    rows = m.abs().sum(-1)
    diagonal = m.diagonal(dim1=-2, dim2=-1)
    sign = torch.where(diagonal < 0, -1.0, 1.0).to(m.dtype)
    shift = torch.diag_embed(sign * (rows + spread))
    return (m + shift).to(drawn.dtype)

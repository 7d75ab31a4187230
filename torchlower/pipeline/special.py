"""The check's special-values point: the example with NaN, ±inf, ±0, the largest and smallest
normal values and denormals in a few positions of every float input.

Random points drawn like the example never reach these values, where tract and torch may part
(a reduction that drops NaN, a sigmoid with an absolute floor, a cast of inf). The point is
compared position by position (NaN where torch has NaN, the same infinity where torch has one):

- ``check=True`` (the default): compared when torch's own outputs there are all finite floats
  (the model clamps, masks or saturates the special values away), and then either ✓ or listed
  as skipped *with the difference found* (never failing: a model that never sees NaN must
  not be refused for ``sign(NaN)``); otherwise listed as skipped with the count of torch's
  non-finite elements — a NaN in an input usually spreads, and the differences left at NaN /
  inf are documented (docs/reliability.md);
- ``check="special"``: always counted, so every difference at NaN / inf refuses the export.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

LABEL = "special values"
AUTO, STRICT = "auto", "strict"
MAX_ROUNDS = 6  # special points at most, when an input has fewer elements than special values


def specials(dtype: torch.dtype) -> list[float]:
    """NaN, ±inf, ±0, ±largest and ±smallest normal, denormals (of ``dtype``), most telling first."""
    info = torch.finfo(dtype)
    sub = info.smallest_normal * info.eps  # the smallest denormal
    nan, inf = float("nan"), float("inf")
    return [nan, inf, -inf, -0.0, 0.0, info.max, -info.max, info.smallest_normal, -info.smallest_normal,
            sub, -sub, 3 * sub]  # fmt: skip


def rounds(example: Sequence[torch.Tensor]) -> int:
    """How many special points cover every special value in every float input (an input with
    fewer elements than values takes them in turns), at most ``MAX_ROUNDS``."""
    sizes = [t.numel() for t in example if t.is_floating_point() and t.numel() > 0]
    need = [-(-len(specials(torch.float32)) // min(n, len(specials(torch.float32)))) for n in sizes]
    return min(MAX_ROUNDS, max(need, default=1))


def with_specials(t: torch.Tensor, turn: int = 0) -> torch.Tensor:
    """``t`` with one of each special value at positions spread evenly over its elements; with
    fewer elements than values, turn ``k`` places the ``k``-th group of them (the last group
    again past the end). Other types unchanged."""
    if not t.is_floating_point() or t.numel() == 0:
        return t.clone()
    every = specials(t.dtype)
    m = min(t.numel(), len(every))
    start = min(turn * m, len(every) - m)
    values = every[start : start + m]
    flat = t.detach().clone().reshape(-1)
    step = max(1, flat.numel() // len(values))
    for k, v in enumerate(values):
        flat[(k * step + step // 2) % flat.numel()] = v
    return flat.reshape(t.shape)


def has_float(example: Sequence[torch.Tensor]) -> bool:
    return any(t.is_floating_point() and t.numel() > 0 for t in example)


def skip_reason(outputs: Sequence[torch.Tensor]) -> str | None:
    """Why the default check does not count this point: torch's outputs are not all finite, or
    not all floats (an index or a comparison of NaN is the kernel's choice: argmax of a NaN row)."""
    if not all(t.is_floating_point() for t in outputs):
        return (
            "integer or bool outputs at NaN / inf inputs depend on the kernel (argmax, casts);"
            " check='special' compares them position by position"
        )
    bad = sum(int((~torch.isfinite(t)).sum()) for t in outputs if t.is_floating_point() or t.is_complex())
    if not bad:
        return None
    return (
        f"PyTorch's output is NaN or ±inf at {bad} position(s) here; check='special' compares"
        " them position by position"
    )


def difference(failures: Iterable[str]) -> str:
    """The skip reason of a default special-values point where tract differs from torch."""
    return (
        f"tract differs from PyTorch at special values ({'; '.join(failures)}); not counted by default"
        " (check='special' refuses it; docs/reliability.md lists the known differences)"
    )

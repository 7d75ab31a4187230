"""Overlap-add of frames whose count is dynamic: ``istft`` on a time axis that varies.

With a hop that divides the frame (``n = k·hop``, every usual STFT), frame ``t`` adds its chunk
``j`` (``hop`` samples) to output block ``t + j``. So the output is the sum over ``j`` of chunk
``j`` of every frame, padded by ``j`` blocks before and ``k - 1 - j`` after: ``k`` slices, pads
and adds of constant sizes, whatever the frame count. The window envelope (Σ w² of the frames
over each sample) is the same overlap-add of ``w²`` broadcast to the frames, so no frame count
is ever baked in.
"""

from __future__ import annotations

import torch

from torchlower.core.values import Dim, Value, constant
from torchlower.errors import LoweringError
from torchlower.rules.common import Builder
from torchlower.rules.layout import broadcast_to, dims_of, slice_dim


def overlap_add(b: Builder, frames: Value, hop: int) -> Value:
    """``(…, F, n)`` frames → ``(…, hop·(F + n/hop - 1))`` samples, frame t at ``t·hop``."""
    *lead, count, n = dims_of(frames)
    if not isinstance(n, int) or n % hop:
        raise LoweringError(
            f"istft on a dynamic frame count needs hop_length dividing n_fft (got {hop} and {n}); "
            "make the time axis static or pick a hop that divides n_fft"
        )
    k, axis = n // hop, len(lead)
    chunks = b.call("reshape", [frames], {"shape": [*lead, count, k, hop]}, dtype=frames.dtype,
                    shape=(*lead, count, k, hop))  # fmt: skip
    blocks: Dim = count + (k - 1)
    total: Value | None = None
    for j in range(k):
        c = slice_dim(b, chunks, axis + 1, j, j + 1)
        c = b.call("squeeze", [c], {"axes": [axis + 1]}, dtype=frames.dtype, shape=(*lead, count, hop))
        if k > 1:
            pads = [(0, 0)] * (axis + 2)
            pads[axis] = (j, k - 1 - j)
            c = b.call("pad", [c], {"padding": pads, "border": "constant", "value": 0.0}, dtype=frames.dtype,
                       shape=(*lead, blocks, hop))  # fmt: skip
        total = c if total is None else b.call("add", [total, c], dtype=frames.dtype, shape=c.shape)
    assert total is not None
    return b.call("reshape", [total], {"shape": [*lead, blocks * hop]}, dtype=frames.dtype,
                  shape=(*lead, blocks * hop))  # fmt: skip


def dynamic_istft_tail(
    b: Builder, weighted: Value, window: torch.Tensor, hop: int, center: bool, length: Dim | None
) -> Value:
    """Overlap-add of windowed ``(…, n, F)`` frames with F dynamic, divided by the summed squared
    window, ``center`` trimmed and cut to ``length`` as ``torch.istft`` does."""
    *lead, n, count = dims_of(weighted)
    perm = [*range(len(lead)), len(lead) + 1, len(lead)]
    frames = b.call("transpose", [weighted], {"axes": perm}, dtype=weighted.dtype, shape=(*lead, count, n))
    y = overlap_add(b, frames, hop)
    squares = constant((window**2).to(torch.float32).reshape(1, int(n)))
    envelope = overlap_add(b, broadcast_to(b, squares, [count, n], torch.float32), hop)
    start = int(n) // 2 if center else 0
    if _zero_somewhere(window, hop, start, int(n) // 2 if center else 0):
        raise LoweringError("istft: the window overlap-add is zero somewhere (torch fails there too)")
    y = b.call("div", [y, unsqueeze_lead(b, envelope, len(lead))], dtype=y.dtype, shape=y.shape)
    samples = dims_of(y)[-1]
    end = start + length if length is not None else samples - (int(n) // 2 if center else 0)
    return slice_dim(b, y, len(lead), start, end)


def _zero_somewhere(window: torch.Tensor, hop: int, start: int, trimmed_end: int) -> bool:
    """Whether Σ w² vanishes at a kept sample for some frame count: the envelope of 2·n/hop
    frames holds every pattern (the first and last n/hop - 1 blocks and the periodic middle)."""
    n = window.numel()
    frames = 2 * (n // hop)
    envelope = torch.zeros(n + hop * (frames - 1), dtype=torch.float64)
    for t in range(frames):
        envelope[t * hop : t * hop + n] += window.to(torch.float64) ** 2
    return bool((envelope[start : envelope.numel() - trimmed_end].abs() < 1e-11).any())


def unsqueeze_lead(b: Builder, x: Value, count: int) -> Value:
    if count == 0:
        return x
    return b.call(
        "unsqueeze", [x], {"axes": list(range(count))}, dtype=x.dtype, shape=(1,) * count + dims_of(x)
    )

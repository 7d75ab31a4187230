"""Qwen2-VL's multimodal rotary positions (M-RoPE), computed outside the graph from the prompt.

Each position has three indices (time, height, width). A text token takes ``(n, n, n)`` with
``n`` one past the largest index so far; a run of image tokens is one image's grid of merged
patches ``[t, h, w]`` and its token ``(i, j, k)`` takes ``(n + i, n + j, n + k)``. Every
generated token continues from one past the largest index: the positions HF's
``get_rope_index`` and its ``rope_deltas`` give (tested against them).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def mrope_positions(
    ids: np.ndarray, token_id: int, grid: Sequence[int], start: int = 0
) -> tuple[np.ndarray, int]:
    """``position_ids`` [3, 1, S] of the prompt ``ids`` [1, S] (image runs of ``token_id``, each
    ``prod(grid)`` tokens of the merged grid ``[t, h, w]``) and the next text position."""
    t, h, w = (int(n) for n in grid)
    block = np.stack(np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")).reshape(3, -1)
    out: list[np.ndarray] = []
    row, i, n = ids.reshape(-1), 0, start
    while i < row.size:
        if row[i] == token_id:
            out.append(block + n)
            n += int(block.max()) + 1
            i += block.shape[1]
        else:
            out.append(np.full((3, 1), n))
            n, i = n + 1, i + 1
    positions = np.concatenate(out, axis=1)[:, None, : row.size]
    return np.ascontiguousarray(positions, np.int64), n


def text_positions(position: int, count: int = 1) -> np.ndarray:
    """``position_ids`` [3, 1, count] of ``count`` text tokens from ``position``."""
    return np.broadcast_to(np.arange(position, position + count), (3, 1, count)).astype(np.int64)

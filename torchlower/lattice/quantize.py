"""int4 / int8 affine group quantization of conv and linear weights, packed as the lattice
consumer reads it.

Rows are ``(K·O, I)`` (``K`` kernel offsets, x-major), ``I`` zero-padded to the group size.
Per group: ``bias = max``, ``scale = (min − max) / (2^bits − 1)``, ``value = code·scale + bias``;
codes are packed little-endian into uint32 words (element ``j`` at bit ``j·bits``). Stored
shapes are ``(K, words, O)`` / ``(K, groups, O)``, except ``(1, O, ·)`` for linear weights and
1×1×1 convs.
"""

from __future__ import annotations

import torch

from torchlower.errors import InvalidArgumentError

GROUP_SIZES = (32, 64, 128)
BITS = (4, 8)
SCALE_DTYPES = {"f16": torch.float16, "f32": torch.float32, "bf16": torch.bfloat16}


def check_options(bits: int | None, group_size: int, scale_dtype: str) -> None:
    """Reject what the consumer rejects, before any work."""
    if bits is None:
        return
    if bits not in BITS:
        raise InvalidArgumentError(f"quantize_bits must be one of {BITS} or None, got {bits!r}")
    if group_size not in GROUP_SIZES:
        raise InvalidArgumentError(
            f"group_size must be one of {GROUP_SIZES} (the consumer's sizes), got {group_size!r}"
        )
    if scale_dtype not in SCALE_DTYPES:
        raise InvalidArgumentError(f"scale_dtype must be one of {tuple(SCALE_DTYPES)}, got {scale_dtype!r}")


def _rows(weight: torch.Tensor, kind: str) -> tuple[torch.Tensor, int, int]:
    """``(K·O, I)`` rows, K and O: conv ``[O, kx, ky, kz, I]`` → ``[K, O, I]``; linear ``[O, I]``."""
    out_ch, in_ch = weight.shape[0], weight.shape[-1]
    if kind == "linear":
        return weight.reshape(out_ch, in_ch), 1, out_ch
    k = weight[0, ..., 0].numel()
    return weight.reshape(out_ch, k, in_ch).transpose(0, 1).reshape(k * out_ch, in_ch), k, out_ch


def pack(
    weight: torch.Tensor, kind: str, bits: int, group_size: int, scale_dtype: str
) -> dict[str, torch.Tensor]:
    """``{"weight": uint32 words, "scales": ..., "biases": ...}`` for one weight."""
    check_options(bits, group_size, scale_dtype)
    rows, k, out_ch = _rows(weight.to(torch.float32), kind)
    in_ch = rows.shape[1]
    padded = -(-in_ch // group_size) * group_size
    rows = torch.nn.functional.pad(rows, (0, padded - in_ch))
    groups = rows.reshape(rows.shape[0], -1, group_size)
    top, bottom = groups.amax(dim=2), groups.amin(dim=2)
    levels = 2**bits - 1
    scale = ((bottom - top) / levels).to(SCALE_DTYPES[scale_dtype])
    bias = top.to(SCALE_DTYPES[scale_dtype])
    s, b = scale.float().unsqueeze(2), bias.float().unsqueeze(2)
    safe = torch.where(s == 0, torch.ones_like(s), s)
    codes = torch.where(s == 0, torch.zeros_like(groups), torch.round((groups - b) / safe)).clamp(0, levels)
    codes = codes.to(torch.int64).reshape(rows.shape[0], -1)  # [rows, padded]
    per_word = 32 // bits
    shifts = torch.arange(per_word, dtype=torch.int64) * bits
    words = (codes.reshape(rows.shape[0], -1, per_word) << shifts).sum(dim=2)  # [rows, words] < 2^32
    words = words.to(torch.uint32) if hasattr(torch, "uint32") else words
    return {
        "weight": _layout(words, k, out_ch, kind),
        "scales": _layout(scale, k, out_ch, kind),
        "biases": _layout(bias, k, out_ch, kind),
    }


def _layout(per_row: torch.Tensor, k: int, out_ch: int, kind: str) -> torch.Tensor:
    cols = per_row.shape[1]
    if kind == "linear" or k == 1:
        return per_row.reshape(1, out_ch, cols).contiguous()
    return per_row.reshape(k, out_ch, cols).transpose(1, 2).contiguous()


def unpack(parts: dict[str, torch.Tensor], shape: tuple[int, ...], kind: str, bits: int) -> torch.Tensor:
    """Dequantize packed ``parts`` back into a float32 weight of ``shape`` (conv or linear)."""
    out_ch, in_ch = shape[0], shape[-1]
    k = 1 if kind == "linear" else int(torch.tensor(shape[1:-1]).prod())
    words, scales, biases = (parts[n] for n in ("weight", "scales", "biases"))
    if kind == "linear" or k == 1:
        words, scales, biases = (t.reshape(out_ch, -1) for t in (words, scales, biases))
    else:
        words, scales, biases = (t.transpose(1, 2).reshape(k * out_ch, -1) for t in (words, scales, biases))
    per_word = 32 // bits
    w64 = words.to(torch.int64) & 0xFFFFFFFF
    shifts = torch.arange(per_word, dtype=torch.int64) * bits
    codes = ((w64.unsqueeze(2) >> shifts) & (2**bits - 1)).reshape(w64.shape[0], -1).float()
    group = codes.shape[1] // scales.shape[1]
    values = codes * scales.float().repeat_interleave(group, dim=1) + biases.float().repeat_interleave(
        group, dim=1
    )
    rows = values[:, :in_ch]
    if kind == "linear":
        return rows.reshape(shape)
    return rows.reshape(k, out_ch, in_ch).transpose(0, 1).reshape(shape).contiguous()

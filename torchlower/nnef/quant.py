"""Block-quantized weight formats tract reads from ``.dat`` files (Q4_0, Q8_1).

Both formats quantize a tensor as a matrix ``[M, K]`` (first dim by the product of the others),
in blocks of 32 consecutive values along ``K``; ``K`` must be a multiple of 32.

- Q4_0 (item type bytes ``40 30``, GGML nibble order): 18 bytes per block, an f16 scale ``d``
  then 16 bytes where byte ``j`` holds value ``j`` (low nibble) and ``j + 16`` (high nibble);
  value = (nibble − 8) × d. ``d`` = (the value of largest magnitude) / −8, as tract and GGML do,
  so that extreme value is exact.
- Q8_1 (item type bytes ``80 30``): 36 bytes per block, f16 scale ``d``, f16 sum of the block's
  values (tract ignores it when computing), then 32 signed bytes; value = byte × d.

The vendor bytes are ``52 54`` ("RT" little-endian: tract's vendor id) and bits per item is
``0xFFFFFFFF``. Rounding uses the f16-rounded scale, so what tract computes is exactly
``dequantize(quantize(w))``, the tensor the check feeds PyTorch.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from torchlower.errors import ArtifactError
from torchlower.nnef.dat_header import header

if TYPE_CHECKING:
    import torch

BLOCK = 32
VENDOR = 0x5452  # 'T' << 8 | 'R'
Q4_0_TYPE = 0x3040
Q8_1_TYPE = 0x3080


@dataclass(frozen=True)
class BlockFormat:
    name: str
    item_type: int
    block_bytes: int


Q4_0 = BlockFormat("q4_0", Q4_0_TYPE, 2 + BLOCK // 2)
Q8_1 = BlockFormat("q8_1", Q8_1_TYPE, 4 + BLOCK)
FORMATS = {f.name: f for f in (Q4_0, Q8_1)}
FORMAT_OF_TYPE = {f.item_type: f for f in (Q4_0, Q8_1)}


@dataclass(frozen=True)
class BlockQuantized:
    """A weight stored in a block format: ``data`` holds the blocks, ``shape`` the logical shape."""

    format: BlockFormat
    shape: tuple[int, ...]
    data: bytes

    @property
    def nbytes(self) -> int:
        return len(self.data)

    def dequantize(self) -> np.ndarray:
        return dequantize(self.format, self.data, self.shape)

    def encode(self) -> bytes:
        """The ``.dat`` file: header with the logical shape (tract blocks rows of dims[1:])."""
        kind = struct.pack("<HH", self.format.item_type, VENDOR)
        data = self.data  # once: ``DeferredBlocks`` packs on each access
        return header(self.shape, 0xFFFFFFFF, 0, len(data), raw_item_type=kind) + data


def can_block_quantize(shape: tuple[int, ...]) -> bool:
    """tract needs rank ≥ 2 and the product of all dims but the first a multiple of 32."""
    return len(shape) >= 2 and int(np.prod(shape[1:])) % BLOCK == 0 and shape[0] > 0


def quantize(
    fmt: BlockFormat, array: np.ndarray, release: Callable[[np.ndarray], None] | None = None
) -> BlockQuantized:
    """Pack a float array (rank ≥ 2, trailing size a multiple of 32) in ``fmt``.

    ``release(part)`` runs on each packed slice of the input (a memory-mapped weight drops
    its pages as it goes, so packing a large tensor never holds all of it)."""
    shape = tuple(int(d) for d in array.shape)
    if not can_block_quantize(shape):
        raise ValueError(f"{fmt.name} needs rank >= 2 and trailing size a multiple of {BLOCK}: {shape}")
    blocks = np.asarray(array, np.float32).reshape(-1, BLOCK)
    pack = _pack_q4_0 if fmt is Q4_0 else _pack_q8_1
    # blocks are independent: packing 2^15 at a time bounds the temporaries (~4 MiB of input)
    step = 1 << 15
    parts = []
    for i in range(0, len(blocks), step):
        parts.append(pack(blocks[i : i + step]))
        if release is not None:
            release(blocks[i : i + step])
    return BlockQuantized(fmt, shape, b"".join(parts))


class DeferredBlocks(BlockQuantized):
    """Blocks packed when the archive writer asks for them, from the weight as the model holds it.

    An export without a check needs no dequantized copy, so nothing is packed ahead: the
    writer packs one tensor at a time and the packed bytes live only while they are written
    (a 30 GB checkpoint's blocks are ~4 GB). ``data`` packs again on every access.
    """

    def __init__(
        self,
        fmt: BlockFormat,
        source: torch.Tensor,
        transpose: bool,
        release: Callable[[Any], None] | None = None,
    ) -> None:
        shape = (*source.shape[:-2], source.shape[-1], source.shape[-2]) if transpose else source.shape
        object.__setattr__(self, "format", fmt)
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))
        object.__setattr__(self, "_source", (source, transpose, release))

    @property  # type: ignore[override]
    def data(self) -> bytes:
        source, transpose, release = self._source  # type: ignore[attr-defined]
        if transpose:
            packed = quantize(self.format, source.transpose(-1, -2).contiguous().numpy())
            if release is not None:
                release(source)
            return packed.data
        return quantize(self.format, source.contiguous().numpy(), release and _pages(release)).data

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) // BLOCK * self.format.block_bytes


def _pages(release: Callable[[Any], None]) -> Callable[[np.ndarray], None]:
    return lambda part: release(memoryview(part).cast("B"))


def _pack_q4_0(blocks: np.ndarray) -> bytes:
    idx = np.abs(blocks).argmax(axis=1)
    extreme = blocks[np.arange(len(blocks)), idx]
    scale = (extreme / -8.0).astype(np.float16)
    inv = np.divide(1.0, scale.astype(np.float32), out=np.zeros(len(blocks), np.float32), where=scale != 0)
    codes = np.clip(np.floor(blocks * inv[:, None] + 8.5), 0, 15).astype(np.uint8)
    nibbles = codes[:, :16] | (codes[:, 16:] << 4)
    out = np.concatenate([scale.view(np.uint8).reshape(-1, 2), nibbles], axis=1)
    return out.tobytes()


def _pack_q8_1(blocks: np.ndarray) -> bytes:
    amax = np.abs(blocks).max(axis=1)
    scale = (amax / 127.0).astype(np.float16)
    inv = np.divide(1.0, scale.astype(np.float32), out=np.zeros(len(blocks), np.float32), where=scale != 0)
    codes = np.clip(np.round(blocks * inv[:, None]), -127, 127).astype(np.int8)
    total = (codes.astype(np.float32) * scale.astype(np.float32)[:, None]).sum(axis=1).astype(np.float16)
    head = np.stack([scale.view(np.uint8).reshape(-1, 2), total.view(np.uint8).reshape(-1, 2)], axis=1)
    out = np.concatenate([head.reshape(-1, 4), codes.view(np.uint8)], axis=1)
    return out.tobytes()


def dequantize(fmt: BlockFormat, data: bytes, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 values the blocks stand for, in ``shape``."""
    count = int(np.prod(shape))
    raw = np.frombuffer(data, np.uint8)
    if count % BLOCK or raw.size != count // BLOCK * fmt.block_bytes:
        raise ArtifactError(f"{fmt.name}: {raw.size} bytes cannot hold a tensor of shape {list(shape)}")
    raw = raw.reshape(-1, fmt.block_bytes)
    out = np.empty((len(raw), BLOCK), np.float32)
    step = 1 << 17  # blocks at a time: bounded temporaries for large tensors
    for i in range(0, len(raw), step):
        part = raw[i : i + step]
        scale = part[:, :2].copy().view(np.float16).astype(np.float32)
        if fmt is Q4_0:
            nib = part[:, 2:]
            codes = np.concatenate([nib & 0x0F, nib >> 4], axis=1).astype(np.float32) - 8.0
        else:
            codes = part[:, 4:].copy().view(np.int8).astype(np.float32)
        out[i : i + step] = codes * scale
    return out.reshape(shape)


def header_format(blob: bytes) -> BlockFormat | None:
    """The block format of a ``.dat`` header, or None for a Khronos tensor."""
    bits, item_type, vendor = struct.unpack_from("<IHH", blob, 44)
    if vendor != VENDOR or bits != 0xFFFFFFFF:
        return None
    return FORMAT_OF_TYPE.get(item_type)


# ---- choosing and packing the weights of an export ----------------------------------------
@dataclass(frozen=True)
class _Use:
    assignment: Any  # text.Assignment
    slot: int  # operand index


def compress_weights(
    builder: Any,
    fmt: BlockFormat,
    params: Mapping[str, torch.Tensor],
    release: Callable[[Any], None] | None = None,
    dequantized_copy: bool = True,
) -> dict[str, torch.Tensor]:
    """Store eligible weights of ``builder`` in ``fmt``; returns the dequantized parameters.

    Eligible: a variable whose label is a model parameter (so PyTorch can run the dequantized
    model) and whose every use is the right operand of a ``matmul`` (linear / matmul-by-constant),
    the filter of a ``conv``, or the table of a ``tract_core_gather`` on axis 0 (embedding), with
    the reduced size a multiple of 32. ``x @ W`` stores ``Wᵀ`` and flips ``transposeB`` so the
    blocks run along the reduced dim, as tract's block-quantized matmul needs.
    ``release(param)`` runs after a parameter is packed (memory-mapped weights drop their pages).
    ``dequantized_copy=False`` (nothing will run the dequantized model) packs nothing now:
    each weight becomes ``DeferredBlocks``, packed by the archive writer, and none is returned.
    """
    import torch

    live = builder.live_assignments()
    variables = {a.outputs[0].name: a for a in live if a.op.startswith("variable")}
    uses: dict[str, list[_Use]] = {name: [] for name in variables}
    for a in live:
        for slot, arg in enumerate(flat_items(a.args) + flat_items(list(a.attrs.values()))):
            if getattr(arg, "name", None) in uses and not a.op.startswith("variable"):
                uses[arg.name].append(_Use(a, slot))
    dequantized: dict[str, torch.Tensor] = {}
    for name, var in variables.items():
        label = var.attrs["label"]
        weight = builder.weights.get(label)
        param = params.get(label)
        if param is None or weight is None or not weight.is_floating_point() or not uses[name]:
            continue
        if weight.numel() != param.numel() or not same_tensor(weight.reshape(param.shape), param.detach()):
            continue  # not the parameter as the model holds it (folded, sliced...)
        kinds = {_kind(u, weight) for u in uses[name]}
        if None in kinds or len(kinds) != 1 or ("transpose" in kinds and len(uses[name]) != 1):
            continue
        kind = kinds.pop()
        stored = param.detach().float().reshape(weight.shape)  # not an f16 weight's rounding
        if kind == "transpose":
            stored = stored.transpose(-1, -2)  # a view: copied only when packed
        if not can_block_quantize(tuple(stored.shape)) or (kind != "conv" and stored.shape[-1] % BLOCK):
            continue
        if kind == "transpose":
            use = uses[name][0].assignment
            use.attrs["transposeB"] = True
            var.attrs["shape"] = list(stored.shape)
        elif kind == "gather":
            for u in uses[name]:
                u.assignment.attrs["datum_type"] = builder.dtype_name(torch.float32)
        if not dequantized_copy:
            source = param.detach().float().reshape(weight.shape)
            builder.weights[label] = DeferredBlocks(fmt, source, kind == "transpose", release)
            continue
        packed = quantize(fmt, stored.contiguous().numpy())
        values = torch.from_numpy(packed.dequantize())
        if kind == "transpose":
            values = values.transpose(-1, -2)
        builder.weights[label] = packed
        dequantized[label] = values.reshape(param.shape).to(param.dtype)
        if release is not None:
            release(param)
    return dequantized


def same_tensor(weight: torch.Tensor, param: torch.Tensor) -> bool:
    """The builder's weight is the parameter (often the very same memory: no need to read it)."""
    if (
        weight.dtype == param.dtype
        and weight.data_ptr() == param.data_ptr()
        and weight.stride() == param.stride()
    ):
        return True
    import torch  # imported at call time in this module, as in compress_weights

    return torch.equal(weight, param.to(weight.dtype))


def batched(shape: Any) -> bool:
    """A matrix per batch entry (MoE experts): tract packs block-quantized weights only as [1.., M, K]."""
    return len(shape) > 2 and any(int(d) != 1 for d in shape[:-2])


def _kind(use: _Use, weight: torch.Tensor) -> str | None:
    """How a weight is used: ``rows`` (blocks along its last dim), ``transpose``, ``conv``, ``gather``."""
    a = use.assignment
    if a.op == "matmul" and use.slot == 1 and not a.attrs.get("transposeA"):
        if batched(weight.shape):
            return None
        return "rows" if a.attrs.get("transposeB") else "transpose"
    if a.op == "conv" and use.slot == 1:
        return "conv"  # blocks run over in_channels/groups × kernel, flattened
    if a.op == "tract_core_gather" and use.slot == 0 and a.attrs.get("axis") == 0:
        return "gather"
    return None


def flat_items(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        out += flat_items(list(item)) if isinstance(item, (list, tuple)) else [item]
    return out

"""The 128-byte header of an NNEF ``.dat`` file, shared by plain tensors (``dat``) and tract's
block-quantized ones (``quant``), so neither imports the other for it."""

from __future__ import annotations

import struct

from torchlower.errors import ArtifactError

HEADER_SIZE = 128
MAGIC = b"\x4e\xef"
MAX_RANK = 8


def header(
    shape: tuple[int, ...],
    bits: int,
    item_type: int,
    data_length: int,
    vendor: int = 0,
    raw_item_type: bytes | None = None,
) -> bytes:
    """Pack a header; ``raw_item_type`` overrides (item type, vendor) bytes for vendor formats."""
    if len(shape) > MAX_RANK:
        raise ArtifactError(f".dat rank {len(shape)} exceeds the NNEF limit of {MAX_RANK}")
    dims = list(shape) + [0] * (MAX_RANK - len(shape))
    head = MAGIC + bytes([1, 0]) + struct.pack("<II8II", data_length, len(shape), *dims, bits)
    head += raw_item_type if raw_item_type is not None else struct.pack("<HH", item_type, vendor)
    return head + b"\0" * (HEADER_SIZE - len(head) - 0)

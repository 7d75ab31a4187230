"""The NNEF tensor file (``.dat``): 128-byte header (``dat_header``), then C-order little-endian data."""

from __future__ import annotations

import struct

import numpy as np

from torchlower.errors import ArtifactError
from torchlower.nnef import quant
from torchlower.nnef.dat_header import HEADER_SIZE, MAGIC, MAX_RANK, header

# item type codes of the Khronos header
FLOAT, UINT, QUINT, QINT, INT, BOOL = 0, 1, 2, 3, 4, 5

_CODE_OF_KIND = {"f": FLOAT, "u": UINT, "i": INT, "b": BOOL}
_DTYPES = {
    (FLOAT, 16): np.float16,
    (FLOAT, 32): np.float32,
    (FLOAT, 64): np.float64,
    (INT, 8): np.int8,
    (INT, 16): np.int16,
    (INT, 32): np.int32,
    (INT, 64): np.int64,
    (UINT, 8): np.uint8,
    (UINT, 16): np.uint16,
    (UINT, 32): np.uint32,
    (UINT, 64): np.uint64,
    (BOOL, 1): np.bool_,
    # linearly quantized codes (scale and zero point live in graph.quant): the integers as stored
    (QUINT, 8): np.uint8,
    (QINT, 8): np.int8,
    (QUINT, 16): np.uint16,
    (QINT, 16): np.int16,
    (QINT, 32): np.int32,
}


def encode(array: np.ndarray) -> bytes:
    """Encode a numpy array (float16/32/64, int8..64, uint8..64, bool) as ``.dat`` bytes."""
    return b"".join(parts(array))


def parts(array: np.ndarray) -> tuple[bytes, memoryview]:
    """The ``.dat`` file as (header, data): the data is a view of ``array``'s own buffer.

    Writers stream both pieces, so a weight is never copied on its way to disk (a C-contiguous
    little-endian array is used in place; only bool packing and byte swapping allocate).
    """
    array = np.asarray(array)
    if not array.flags.c_contiguous:  # (ascontiguousarray would turn rank 0 into rank 1)
        array = array.copy(order="C")
    kind = array.dtype.kind
    if kind not in _CODE_OF_KIND:
        raise ArtifactError(f"cannot store dtype {array.dtype} in a .dat file")
    if kind == "b":
        data = np.packbits(array.reshape(-1), bitorder="big")
        bits = 1
    else:
        data = array.astype(array.dtype.newbyteorder("<"), copy=False).reshape(-1)
        bits = array.dtype.itemsize * 8
    view = memoryview(data.view(np.uint8))
    return header(array.shape, bits, _CODE_OF_KIND[kind], view.nbytes), view


def decode(blob: bytes, name: str = "<tensor>") -> np.ndarray:
    """Decode ``.dat`` bytes, validating every header field against the data."""
    if len(blob) < HEADER_SIZE:
        raise ArtifactError(f"{name}: file is {len(blob)} bytes, shorter than the 128-byte header")
    if blob[:2] != MAGIC:
        raise ArtifactError(f"{name}: bad magic {blob[:2].hex()} (expected 4eef)")
    if blob[2] != 1:
        raise ArtifactError(f"{name}: unsupported version {blob[2]}.{blob[3]} (expected 1.x)")
    length, rank = struct.unpack_from("<II", blob, 4)
    if rank > MAX_RANK:
        raise ArtifactError(f"{name}: rank {rank} exceeds {MAX_RANK}")
    dims = struct.unpack_from("<8I", blob, 12)[:rank]
    bits, item_type, vendor = struct.unpack_from("<IHH", blob, 44)
    if len(blob) != HEADER_SIZE + length:
        raise ArtifactError(
            f"{name}: data length field says {length} bytes but the file holds {len(blob) - HEADER_SIZE}"
        )
    block = quant.header_format(blob)
    if block is not None:  # tract's block-quantized weights decode to float32
        if rank < 2:
            raise ArtifactError(f"{name}: a {block.name} tensor needs rank >= 2, header says {rank}")
        return quant.dequantize(block, blob[HEADER_SIZE:], tuple(dims))
    dtype = _DTYPES.get((item_type, bits)) if vendor == 0 else None
    if dtype is None:
        raise ArtifactError(
            f"{name}: unknown item type {item_type} with {bits} bits per item (vendor {vendor})"
        )
    count = 1
    for d in dims:
        count *= d
    expected = (count + 7) // 8 if bits == 1 else count * bits // 8
    if expected != length:
        raise ArtifactError(f"{name}: dims {list(dims)} need {expected} bytes, header says {length}")
    data = blob[HEADER_SIZE:]
    if bits == 1:
        flat = np.unpackbits(np.frombuffer(data, np.uint8), bitorder="big")[:count].astype(bool)
    else:
        flat = np.frombuffer(data, np.dtype(dtype).newbyteorder("<")).astype(dtype)
    return flat.reshape(dims)

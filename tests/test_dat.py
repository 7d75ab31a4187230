"""The .dat codec: every dtype of the guide's table round-trips and tract reads it."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from torchlower.errors import ArtifactError
from torchlower.nnef import dat

DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.bool_]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4), (1, 1, 1, 1, 1, 1, 1, 3)])
def test_round_trip(dtype, shape):
    rng = np.random.default_rng(0)
    array = (rng.standard_normal(shape) * 50).astype(dtype)
    blob = dat.encode(array)
    assert len(blob) == 128 + struct.unpack_from("<I", blob, 4)[0]
    back = dat.decode(blob)
    assert back.dtype == array.dtype and back.shape == array.shape
    np.testing.assert_array_equal(back, array)


def test_header_fields():
    blob = dat.encode(np.zeros((2, 3), np.float32))
    assert blob[:4] == b"\x4e\xef\x01\x00"
    length, rank, d0, d1 = struct.unpack_from("<IIII", blob, 4)
    assert (length, rank, d0, d1) == (24, 2, 2, 3)
    bits, item_type, vendor = struct.unpack_from("<IHH", blob, 44)
    assert (bits, item_type, vendor) == (32, 0, 0)
    assert blob[52:128] == b"\0" * 76


def test_bool_packs_msb_first():
    blob = dat.encode(np.array([True, False, False, False, False, False, False, True, True]))
    assert blob[128:] == bytes([0b10000001, 0b10000000])


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda b: b"XX" + b[2:], "magic"),
        (lambda b: b[:2] + b"\x02" + b[3:], "version"),
        (lambda b: b[:8] + struct.pack("<I", 9) + b[12:], "rank"),
        (lambda b: b[:-1], "data length"),
        (lambda b: b[:48] + struct.pack("<H", 9) + b[50:], "item type"),
        (lambda b: b[:12] + struct.pack("<I", 7) + b[16:], "dims"),
        (lambda b: b[:20], "shorter"),
    ],
)
def test_malformed_headers_are_artifact_errors(mutate, match):
    blob = dat.encode(np.zeros((2, 3), np.float32))
    with pytest.raises(ArtifactError, match=match):
        dat.decode(mutate(blob), "w.dat")

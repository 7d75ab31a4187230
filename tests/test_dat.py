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


def test_parts_stream_the_array_buffer_without_copying():
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    head, data = dat.parts(array)
    assert np.shares_memory(np.frombuffer(data, np.uint8), array)
    assert head + bytes(data) == dat.encode(array)
    np.testing.assert_array_equal(dat.decode(dat.encode(array)), array)


def test_archive_streams_every_kind_of_weight(tmp_path):
    import tarfile

    import torch

    from torchlower.nnef import archive, quant

    weights = {
        "b": torch.tensor([True, False, True]),
        "h": torch.arange(6, dtype=torch.float16).reshape(2, 3),
        "s": torch.tensor(3.5),
        "t": torch.arange(12.0).reshape(3, 4).t(),  # not contiguous
        "q": quant.quantize(quant.Q4_0, np.ones((2, 32), np.float32)),
    }
    for name in ("w.nnef.tar", "w.nnef.tgz"):
        path = archive.write(tmp_path / name, "graph\n", weights)
        with tarfile.open(path) as tar:
            blobs = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        assert blobs["q.dat"] == weights["q"].encode()
        for key in "bhst":
            np.testing.assert_array_equal(dat.decode(blobs[f"{key}.dat"]), weights[key].numpy())


def test_huffman_only_tgz_is_a_standard_reproducible_gzip(tmp_path):
    """The LLM writer's Huffman-only gzip: any gzip reader gets the tar back, bytes repeat."""
    import gzip
    import tarfile

    import torch

    from torchlower.nnef import archive

    weights = {"w": torch.randn(300, 70, generator=torch.Generator().manual_seed(0))}
    paths = [
        archive.write(tmp_path / f"{i}.nnef.tgz", "graph\n", weights, huffman_only=True) for i in range(2)
    ]
    assert paths[0].read_bytes() == paths[1].read_bytes()
    plain = archive.write(tmp_path / "p.nnef.tar", "graph\n", weights)
    assert gzip.decompress(paths[0].read_bytes()) == plain.read_bytes()  # CRC and length checked
    assert paths[0].stat().st_size < 0.95 * plain.stat().st_size  # float exponents do compress
    with tarfile.open(paths[0]) as tar:
        np.testing.assert_array_equal(dat.decode(tar.extractfile("w.dat").read()), weights["w"].numpy())

"""compress="q4_0": tract's 4-bit blocks for linear / matmul-by-constant / conv weights."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch

import torchlower
from tests.models_compress import CNN, MLP, Block
from torchlower.nnef import dat, quant

FRONTENDS = ("jit", "export")


def test_q4_0_byte_layout_by_hand() -> None:
    """One block: f16 scale = extreme / -8, byte j = code j | code j+16 << 4, codes = q + 8."""
    values = ((np.arange(32) % 15) - 7).astype(np.float32) * 0.25  # in [-1.75, 1.75]
    values[0] = 2.0  # the extreme: scale = 2.0 / -8 = -0.25, code 0
    packed = quant.quantize(quant.Q4_0, values.reshape(1, 32))
    blob = packed.encode()
    assert blob[48:52] == b"\x40\x30\x52\x54" and struct.unpack_from("<I", blob, 44)[0] == 0xFFFFFFFF
    assert struct.unpack_from("<I", blob, 4)[0] == 18 and len(blob) == 128 + 18
    body = blob[128:]
    assert np.frombuffer(body[:2], np.float16)[0] == np.float16(-0.25)
    want = (8 - values / 0.25).astype(np.uint8)  # value = (code - 8) * -0.25
    assert list(body[2:]) == [int(want[j]) | int(want[j + 16]) << 4 for j in range(16)]
    np.testing.assert_array_equal(dat.decode(blob), values.reshape(1, 32))


def test_q4_0_round_trip_error_is_bounded() -> None:
    w = np.random.default_rng(0).standard_normal((16, 96)).astype(np.float32)
    back = quant.quantize(quant.Q4_0, w).dequantize()
    step = np.abs(w.reshape(-1, 32)).max(axis=1) / 8
    err = np.abs(back - w).reshape(-1, 32)
    # half a step, except values beyond +7 steps when the extreme is negative (codes end at 15)
    assert (err <= step[:, None] * 1.01).all() and np.median(err / step[:, None]) < 0.3


def test_deferred_blocks_pack_like_quantize_and_release_what_they_read() -> None:
    """Packing at write time (``DeferredBlocks``) gives the bytes of packing ahead, transposed too."""
    w = torch.randn(3 << 15, 64, generator=torch.Generator().manual_seed(0))  # 6 slices of 2^15 blocks
    released: list[int] = []
    rows = quant.DeferredBlocks(quant.Q4_0, w, False, lambda part: released.append(part.nbytes))
    assert rows.nbytes == len(rows.data) and rows.shape == (3 << 15, 64)
    assert rows.encode() == quant.quantize(quant.Q4_0, w.numpy()).encode()
    assert sum(released) == 2 * w.numel() * 4  # every byte read is released (twice: two packs)
    cols = quant.DeferredBlocks(quant.Q4_0, w[:64, :32], True)
    assert cols.shape == (32, 64)
    assert cols.encode() == quant.quantize(quant.Q4_0, w[:64, :32].t().contiguous().numpy()).encode()


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_mlp_q4_0_matches_dequantized_model(frontend: str, tmp_path: Path) -> None:
    model, x = MLP().eval(), torch.randn(4, 64)
    report = torchlower.export(model, x, tmp_path / "m.nnef.tgz", frontend=frontend, compress="q4_0")
    assert report.compress == "q4_0"
    assert all(e.max_abs <= 1e-5 for e in report.errors), report.errors
    assert report.original_errors and all(e.max_abs > 1e-4 for e in report.original_errors)
    # every weight matrix is Q4_0 (64, 128 and 96 are multiples of 32), the biases stay f32
    assert report.weight_bytes_by_format == {
        "float32": (128 + 96 + 32) * 4,
        "q4_0": 9 * 18 * (128 * 2 + 96 * 4 + 32 * 3) // 9,
    }
    art = torchlower.load(report.path)
    assert art.formats["0.weight"] == "q4_0" and art.formats["0.bias"] == "float32"
    assert art.weights["0.weight"].shape == (128, 64) and art.weights["0.weight"].dtype == np.float32
    info = torchlower.inspect(report.path)
    assert info["weights"]["bytes_by_format"]["q4_0"] == report.weight_bytes_by_format["q4_0"]


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_cnn_q4_0_compresses_only_eligible_convs(frontend: str, tmp_path: Path) -> None:
    model, x = CNN().eval(), torch.randn(2, 3, 8, 8)
    report = torchlower.export(model, x, tmp_path / "c.nnef.tgz", frontend=frontend, compress="q4_0")
    assert all(e.max_abs <= 1e-5 for e in report.errors), report.errors
    formats = torchlower.load(report.path).formats
    assert formats["stem.weight"] == "float32"  # reduced size 3*3*3 = 27
    assert formats["body.weight"] == "q4_0"  # 8*2*2 = 32
    assert formats["head.weight"] == "q4_0"  # 256


@pytest.mark.parametrize("frontend", FRONTENDS)
def test_block_q4_0_matmul_by_constant_is_stored_transposed(frontend: str, tmp_path: Path) -> None:
    model, x = Block().eval(), torch.randn(2, 8, 64)
    report = torchlower.export(model, x, tmp_path / "b.nnef", frontend=frontend, compress="q4_0")
    assert all(e.max_abs <= 1e-5 for e in report.errors), report.errors
    art = torchlower.load(report.path)
    assert art.formats["proj"] == "q4_0"
    assert "transposeB = true" in next(
        row
        for row in (report.path / "graph.nnef").read_text().splitlines()
        if "matmul(" in row and "proj" in row
    )
    # the stored matrix is proj transposed, dequantized
    np.testing.assert_allclose(art.weights["proj"].reshape(64, 64).T, model.proj.detach().numpy(), atol=0.2)


def test_q8_1_is_read_but_not_offered(tmp_path: Path) -> None:
    """tract 0.23 loads Q8_1 .dat files but has no matmul/conv kernel for them (codegen fails)."""
    w = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    packed = quant.quantize(quant.Q8_1, w)
    np.testing.assert_allclose(dat.decode(packed.encode()), packed.dequantize())
    assert np.abs(packed.dequantize() - w).max() < np.abs(w).max() / 127
    with pytest.raises(torchlower.errors.InvalidArgumentError, match="compress"):
        torchlower.export(MLP().eval(), torch.randn(1, 64), tmp_path / "m.nnef.tgz", compress="q8_1")


def test_sizes_f32_f16_q4_0(tmp_path: Path) -> None:
    """The closing-note table: a linear-heavy model at each storage option (run with -s)."""
    model, x = MLP((512, 1024, 1024, 256)).eval(), torch.randn(8, 512)
    rows = []
    for name, options in [("f32", {}), ("f16", {"precision": "f16"}), ("q4_0", {"compress": "q4_0"})]:
        report = torchlower.export(model, x, tmp_path / f"{name}.nnef.tgz", **options)
        original = report.original_errors or report.errors
        rows.append(
            (
                name,
                report.weight_bytes,
                max(e.max_abs for e in report.errors),
                max(e.max_abs for e in original),
            )
        )
    base = rows[0][1]
    print("\nformat  weight bytes  ratio  err vs checked ref  err vs f32 model")
    for name, size, err, orig in rows:
        print(f"{name:6} {size:13,d} {base / size:6.2f} {err:18.3g} {orig:17.3g}")
    assert rows[1][1] * 2 == base and base / rows[2][1] > 6.5

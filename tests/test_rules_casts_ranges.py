"""Casts and ranges the reference exporter's own suite has (issue 30 item 8): float → narrow
integer casts of negative and out-of-range values as torch computes them (truncate, then wrap;
tract's float cast saturates), and ``torch.arange`` over 0-d int64 tensors given as inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchlower
from tests.conftest import Fn, export_and_check
from torchlower.errors import ValueDependentTraceError

VALUES = torch.tensor([-3.7, -1.2, -0.5, 0.0, 0.7, 2.5, 200.9, 255.5, 300.2, -200.0, -256.5, 1000.3])


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32])
def test_float_to_integer_cast(dtype: torch.dtype, frontend: str, tmp_path: Path) -> None:
    report = export_and_check(Fn(lambda x: x.to(dtype)), (VALUES,), tmp_path, frontend=frontend)
    assert report.errors[0].max_abs == 0.0


def test_float_to_uint8_wraps_like_torch(tmp_path: Path) -> None:
    out = tmp_path / "m.nnef.tgz"
    torchlower.export(Fn(lambda x: (x * 3).to(torch.uint8)).eval(), (VALUES,), out)
    got = torchlower.load(out).run([VALUES])["output"]
    assert got.tolist() == (VALUES * 3).to(torch.uint8).tolist()  # -11.1 → 245, not tract's 0


def _ranges(s: torch.Tensor, e: torch.Tensor, st: torch.Tensor) -> tuple[torch.Tensor, ...]:
    floats = torch.arange(s, e, 2, dtype=torch.float32)
    return torch.arange(e), torch.arange(s, e), torch.arange(s, e, st), floats


BOUNDS = (torch.tensor(2), torch.tensor(11), torch.tensor(3))


def test_arange_of_tensor_inputs(frontend: str, tmp_path: Path) -> None:
    if frontend == "export":  # torch.export itself refuses: the output length is data-dependent
        with pytest.raises(ValueDependentTraceError, match=r"test_rules_casts_ranges\.py"):
            export_and_check(Fn(_ranges), BOUNDS, tmp_path, frontend=frontend)
        return
    report = export_and_check(Fn(_ranges), BOUNDS, tmp_path, frontend=frontend)
    assert [e.max_abs for e in report.errors[:4]] == [0.0] * 4


def test_arange_of_tensor_inputs_other_lengths(tmp_path: Path) -> None:
    out = tmp_path / "m.nnef.tgz"
    report = torchlower.export(Fn(_ranges).eval(), BOUNDS, out, frontend="auto")
    assert report.frontend == "jit"
    model = torchlower.load(out)
    for s, e, st in [(0, 5, 1), (-4, 20, 5), (3, 30, 7)]:
        args = [torch.tensor(v) for v in (s, e, st)]
        got = model.run(args)
        want = _ranges(*args)
        for name, w in zip(["output_0", "output_1", "output_2", "output_3"], want, strict=True):
            assert got[name].tolist() == w.tolist(), (s, e, st, name)


def test_arange_of_float_tensor_is_refused(tmp_path: Path) -> None:
    with pytest.raises(torchlower.errors.LoweringError, match="0-d integer tensor"):
        torchlower.export(
            Fn(lambda s, e: torch.arange(s, e)).eval(), (torch.tensor(1.5), torch.tensor(7.0)),
            tmp_path / "m.nnef.tgz", frontend="jit",
        )  # fmt: skip

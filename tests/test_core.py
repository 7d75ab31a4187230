"""Contract tests of export(): determinism, the user's model untouched, errors, atomic writes."""

from __future__ import annotations

import gzip
import tarfile

import pytest
import torch
from torch import nn

import torchlower
from tests.conftest import aborting_graph
from torchlower.errors import (
    CheckError,
    InvalidArgumentError,
    TorchlowerError,
    TraceError,
    UnsupportedOpsError,
)
from torchlower.frontends.jit import ModuleTracer, maybe_quantize_args


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 3))


def test_same_model_same_bytes(tmp_path, frontend):
    model, x = mlp().eval(), torch.randn(2, 4)
    a = torchlower.export(model, x, tmp_path / "a.nnef.tgz", frontend=frontend, check=False)
    b = torchlower.export(model, x, tmp_path / "b.nnef.tgz", frontend=frontend, check=False)
    assert a.path.read_bytes() == b.path.read_bytes()


def test_archive_carries_no_time_host_or_user(tmp_path):
    path = torchlower.export(mlp().eval(), torch.randn(2, 4), tmp_path / "m.nnef.tgz").path
    raw = path.read_bytes()
    assert raw[4:8] == b"\0\0\0\0", "gzip header mtime must be 0"
    assert raw[3] & 0x08 == 0, "gzip header must not carry a file name"
    with tarfile.open(path) as tar:
        infos = tar.getmembers()
        assert [i.name for i in infos] == sorted(i.name for i in infos)
        assert all(i.mtime == 0 and i.uid == 0 and i.gid == 0 and not i.uname for i in infos)
        graph = tar.extractfile("graph.nnef").read().decode()
    import getpass
    import socket

    for secret in (socket.gethostname(), getpass.getuser()):
        assert secret not in graph
    assert gzip.decompress(raw)  # a valid gzip stream


def test_model_is_untouched(tmp_path, frontend):
    model = mlp()
    model.train()
    model[0].weight.requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    flags = {k: p.requires_grad for k, p in model.named_parameters()}
    params = {k: id(p) for k, p in model.named_parameters()}
    torchlower.export(model, torch.randn(2, 4), tmp_path / "m.nnef.tgz", frontend=frontend)
    assert model.training and all(m.training for m in model.modules())
    assert {k: id(p) for k, p in model.named_parameters()} == params
    assert {k: p.requires_grad for k, p in model.named_parameters()} == flags
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


class ThreeUnsupported(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = torch.special.bessel_j0(self.fc(x))
        z = torch.digamma(y.abs() + 1)
        return torch.linalg.det(z.reshape(2, 2, 2)) + torch.digamma(x).sum()


def test_all_unsupported_ops_listed_at_once(tmp_path, frontend):
    target = tmp_path / "m.nnef.tgz"
    with pytest.raises(UnsupportedOpsError) as info:
        torchlower.export(ThreeUnsupported().eval(), torch.randn(2, 4), target, frontend=frontend)
    text = str(info.value)
    for op in ("bessel_j0", "digamma", "det"):
        assert op in text, text
    counts = {o.op.split("::")[-1].split(".")[0]: o.count for o in info.value.ops}
    assert any("digamma" in k and v == 2 for k, v in counts.items()), counts
    assert not target.exists(), "a failed export must not leave a file"


class Broken(nn.Module):
    def forward(self, x):
        return x + torch.zeros(3)


def test_trace_failure_is_a_trace_error():
    tracer = ModuleTracer(Broken(), args=(torch.randn(2, 4),))
    with pytest.raises(TraceError, match=r"Broken\.forward") as info:
        _ = tracer.traced_module
    assert isinstance(info.value.__cause__, RuntimeError)
    assert isinstance(info.value, TorchlowerError)


def test_module_tracer_reuses_a_given_trace():
    model, x = mlp().eval(), torch.randn(2, 4)
    traced = torch.jit.trace(model, x, check_trace=False)
    tracer = ModuleTracer(model, traced_module=traced, args=(x,))
    assert tracer.traced_module is traced
    assert str(tracer.torch_graph) == str(traced.graph)


def test_module_tracer_other_method():
    class TwoHeads(nn.Module):
        def forward(self, x):
            return x + 1

        def embed(self, x):
            return x * 2

    tracer = ModuleTracer(TwoHeads(), fn_name="embed", args=(torch.randn(2),))
    assert "aten::mul" in str(tracer.torch_graph)


def test_maybe_quantize_args_only_for_quantized_modules():
    x = torch.randn(2, 4)
    assert maybe_quantize_args(mlp(), (x,))[0] is x
    assert maybe_quantize_args(mlp(), None) is None
    quantized = torch.ao.nn.quantized.Linear(4, 2)
    (q,) = maybe_quantize_args(nn.Sequential(quantized), (x,))
    assert q.is_quantized


def test_failed_export_keeps_previous_file(tmp_path):
    target = tmp_path / "m.nnef.tgz"
    torchlower.export(mlp().eval(), torch.randn(2, 4), target, check=False)
    before = target.read_bytes()
    with pytest.raises(UnsupportedOpsError):
        torchlower.export(ThreeUnsupported().eval(), torch.randn(2, 4), target)
    assert target.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.nnef.tgz"]


@pytest.mark.parametrize("suffix", [".nnef.tgz", ".nnef.tar", ".nnef"])
def test_archive_formats_run_in_tract(tmp_path, suffix):
    report = torchlower.export(mlp().eval(), torch.randn(2, 4), tmp_path / f"m{suffix}")
    assert report.path.exists() and report.errors[0].ok


def test_check_error_carries_numbers(tmp_path):
    from torchlower.pipeline.export import verify

    model, x = mlp().eval(), torch.randn(2, 4)
    report = torchlower.export(model, x, tmp_path / "m.nnef.tgz", check=False)
    wrong = [model(x).detach() + 1.0]
    with pytest.raises(CheckError) as info:
        verify(report.path, (x,), wrong, ["output"])
    assert info.value.errors[0].max_abs == pytest.approx(1.0, abs=1e-4)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": "not a module"}, "nn.Module"),
        ({"args": [1, 2]}, "tensor"),
        ({"path": "model.onnx"}, "artifact format"),
        ({"input_names": ["a", "b"]}, "input names"),
        ({"output_names": ["a", "b"]}, "output names"),
        ({"frontend": "tflite"}, "frontend"),
    ],
)
def test_bad_arguments(tmp_path, kwargs, match):
    call = {"model": mlp().eval(), "args": torch.randn(2, 4), "path": tmp_path / "m.nnef.tgz"}
    call.update(kwargs)
    with pytest.raises(InvalidArgumentError, match=match):
        torchlower.export(call.pop("model"), call.pop("args"), call.pop("path"), **call)


def test_tract_abort_is_a_check_error_and_the_next_check_works(tmp_path):
    """tract panics (SIGABRT) on an einsum with '...': the caller gets CheckError and survives."""
    import numpy as np

    from torchlower.nnef.tract import run_in_tract

    bad = aborting_graph(tmp_path)
    with pytest.raises(CheckError, match="aborted"):
        run_in_tract(bad, [np.ones((2, 3, 3), np.float32)])
    report = torchlower.export(mlp().eval(), torch.randn(2, 4), tmp_path / "ok.nnef.tgz", frontend="jit")
    assert report.errors[0].ok

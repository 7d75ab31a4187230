"""Streaming (issue 29): export(stream=), load().stream(), the refusals and the typed errors, run in
tract's real pulse transform. The zoo itself (every model at two pulses and three input lengths,
through the CLI and the API) is in test_streaming_cli.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import torchlower
from tests.streaming_models import (
    WAV2LETTER,
    CausalTCN,
    CenteredSTFT,
    ConvTasNet,
    GlobalMean,
    GRUStateInput,
    KeywordSpotter,
    MFCCdBSpotter,
    SelfAttention,
    model_of,
)
from torchlower.artifact.stream_verify import verify_stream
from torchlower.errors import CheckError, InvalidArgumentError, InvalidPulseError, StreamingError


def test_torchaudio_mfcc_with_db_scale_is_a_streaming_error(tmp_path: Path) -> None:
    """MFCC's default dB scale clamps to top_db below the max over the whole spectrogram: refused,
    naming the max and torchaudio's AmplitudeToDB, never streamed with a per-chunk max."""
    pytest.importorskip("torchaudio")
    path = tmp_path / "mfcc_db.nnef.tgz"
    with pytest.raises(
        StreamingError,
        match=r"mfcc.amplitude_to_DB.*(max|sum)_reduce.*whole streaming axis.*AmplitudeToDB.forward at",
    ):
        torchlower.export(
            model_of(MFCCdBSpotter), (torch.randn(1, 4000),), path, dynamic_axes={"x": {1: "T"}},
            stream={"T": 160},
        )  # fmt: skip
    assert not path.exists()


def test_stream_object_push_matches_whole_run(tmp_path: Path) -> None:
    model = model_of(ConvTasNet)
    path = tmp_path / "tasnet.nnef.tgz"
    report = torchlower.export(
        model, (torch.randn(1, 1, 256),), path, dynamic_axes={"x": {2: "T"}}, stream={"T": 64}
    )
    s = report.stream  # the API's report: what the CLI's JSON shows
    assert (s.symbol, s.pulse, s.delay, s.multiple) == ("T", 64, 19, 8)
    assert (s.input_axes, s.output_axes, s.delays) == ({"x": 2}, {"output": 2}, {"output": 19})
    assert [p.length for p in s.points] == [256, 323, 129] and len(s.chunk_seconds) == sum(
        p.chunks for p in s.points
    )
    assert all(e.ok and e.max_abs < 1e-5 for p in s.points for e in p.errors)
    assert torchlower.inspect(path, tract=False)["streaming"]["delay"] == 19
    x = np.random.default_rng(3).standard_normal((1, 1, 300)).astype(np.float32)
    with torchlower.load(path).stream({"T": 32}) as stream:
        assert (stream.pulse, stream.delay) == (32, 19)
        ext = np.concatenate([x, np.zeros((1, 1, 3 * 32 - 300 % 32 + 32), np.float32)], axis=2)
        pieces = [stream.push({"x": ext[..., k : k + 32]})["output"] for k in range(0, ext.shape[2], 32)]
        streamed = np.concatenate(pieces, axis=2)[..., stream.delay :]
        want = model(torch.from_numpy(ext)).detach().numpy()
        n = min(streamed.shape[2], want.shape[2])
        assert n >= 300 - 8
        assert np.abs(streamed[..., :n] - want[..., :n]).max() < 1e-5
        with pytest.raises(InvalidArgumentError, match="each chunk must have 32 steps"):
            stream.push({"x": np.zeros((1, 1, 20), np.float32)})
        with pytest.raises(InvalidArgumentError, match="float64"):
            stream.push({"x": np.zeros((1, 1, 32), np.float64)})
        with pytest.raises(InvalidArgumentError, match="axis 1 has size 2, the graph declares 1"):
            stream.push({"x": np.zeros((1, 2, 32), np.float32)})  # after good chunks: still checked
        again = stream.push({"x": ext[..., :32]})["output"]  # the state carried on: not the first output
        assert np.abs(again - pieces[0]).max() > 1e-3
        stream.reset()
        assert np.array_equal(stream.push({"x": ext[..., :32]})["output"], pieces[0])  # a fresh state
        run = stream.run({"x": x})
        assert run.outputs["output"].shape == (1, 2, 300)
        head = model(torch.from_numpy(x)).detach().numpy()[..., :280]  # before the end of the input
        assert np.abs(run.outputs["output"][..., :280] - head).max() < 1e-5
    with pytest.raises(InvalidPulseError, match=r"valid pulses are 8, 16, 24, 32, … \(multiples of 8\)"):
        torchlower.load(path).stream({"T": 12})
    with pytest.raises(InvalidArgumentError, match=r"not a symbol .*the archive declares"):
        torchlower.load(path).stream({"S": 16})


def test_in_process_stream_gives_the_same_outputs(tmp_path: Path) -> None:
    path = tmp_path / "kws.nnef.tgz"
    model = model_of(KeywordSpotter)
    torchlower.export(model, (torch.randn(1, 1024),), path, dynamic_axes={"x": {1: "T"}}, stream={"T": 128})
    x = np.random.default_rng(5).standard_normal((1, 2000)).astype(np.float32)
    art = torchlower.load(path)
    with art.stream({"T": 160}) as child, art.stream({"T": 160}, isolated=False) as here:
        a, b = child.run({"x": x}), here.run({"x": x})
        assert here.delay == child.delay == 1
    assert np.array_equal(a.outputs["output"], b.outputs["output"])
    want = model(torch.from_numpy(x)).detach().numpy()
    n = want.shape[1] - 2  # frames that do not reach the end of the input
    assert np.abs(b.outputs["output"][:, :n] - want[:, :n]).max() < 1e-5
    with pytest.raises(InvalidArgumentError, match="threads= needs isolated=True"):
        art.stream({"T": 160}, threads=1, isolated=False)


def test_strided_deconv_without_stream_export_is_refused(tmp_path: Path) -> None:
    """tract pulses a strided deconv with a wrong delay: an archive written without stream= keeps
    the deconv, and streaming it is refused rather than run wrong."""
    path = tmp_path / "plain.nnef.tgz"
    torchlower.export(model_of(ConvTasNet), (torch.randn(1, 1, 256),), path, dynamic_axes={"x": {2: "T"}})
    with pytest.raises(StreamingError, match=r"module 'dec'.*wrong delay"):
        torchlower.load(path).stream({"T": 64})


def test_wrong_stream_is_a_check_error_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the pulse-safe decoder (and its refusal) tract's own pulsed deconv streams wrong
    numbers: the streaming check must catch that and write nothing."""
    from torchlower.pipeline import export as export_module

    monkeypatch.setattr(export_module.stream_forms, "pulse_safe", lambda b: [])
    monkeypatch.setattr(export_module, "refuse_hazards", lambda b, s: (1, None))
    path = tmp_path / "wrong.nnef.tgz"
    with pytest.raises(CheckError, match="differ from PyTorch on the whole input"):
        torchlower.export(
            model_of(ConvTasNet),
            (torch.randn(1, 1, 256),),
            path,
            dynamic_axes={"x": {2: "T"}},
            stream={"T": 64},
        )
    assert list(tmp_path.iterdir()) == []


def test_global_pooling_over_time_is_a_streaming_error(tmp_path: Path) -> None:
    path = tmp_path / "mean.nnef.tgz"
    with pytest.raises(
        StreamingError, match=r"mean_reduce.*whole sequence.*GlobalMean.forward at .*streaming_models.py:\d+"
    ):
        torchlower.export(
            GlobalMean(), (torch.randn(1, 8, 64),), path, dynamic_axes={"x": {2: "T"}}, stream={"T": 16}
        )
    assert not path.exists()


def test_center_true_stft_says_use_center_false(tmp_path: Path) -> None:
    path = tmp_path / "stft.nnef.tgz"
    with pytest.raises(
        StreamingError, match=r"line \d+ \(pad = pad\).*use center=False.*CenteredSTFT.forward at .*:\d+"
    ):
        torchlower.export(
            CenteredSTFT(), (torch.randn(1, 512),), path, dynamic_axes={"x": {1: "T"}}, stream={"T": 64}
        )
    assert not path.exists()


def test_attention_over_time_never_streams_wrong(tmp_path: Path) -> None:
    """tract pulses self-attention as attention within each chunk: the streaming check fails, as a
    StreamingError naming the product and its module, and an unverified archive is refused by
    load().stream."""
    model = model_of(SelfAttention)
    path = tmp_path / "attn.nnef.tgz"
    with pytest.raises(
        StreamingError, match=r"differ from PyTorch.*matmul of two computed tensors.*forward at"
    ):
        torchlower.export(
            model, (torch.randn(1, 40, 8),), path, dynamic_axes={"x": {1: "T"}}, stream={"T": 8}
        )
    assert not path.exists()
    torchlower.export(model, (torch.randn(1, 40, 8),), path, dynamic_axes={"x": {1: "T"}})
    with pytest.raises(StreamingError, match="attention"):
        torchlower.load(path).stream({"T": 8})


def test_initial_state_as_an_input_is_refused(tmp_path: Path) -> None:
    args = (torch.randn(1, 40, 8), torch.randn(1, 1, 16))
    with pytest.raises(StreamingError, match=r"input 'h0' has no T axis.*register_buffer"):
        torchlower.export(
            GRUStateInput(), args, tmp_path / "g.nnef.tgz", dynamic_axes={"x": {1: "T"}}, stream={"T": 8}
        )
    assert list(tmp_path.iterdir()) == []


def test_stream_arguments(tmp_path: Path) -> None:
    x = (torch.randn(1, 4, 64),)
    with pytest.raises(InvalidArgumentError, match="not a symbol of the dynamic axes"):
        torchlower.export(
            CausalTCN(), x, tmp_path / "a.nnef.tgz", dynamic_axes={"x": {2: "T"}}, stream={"S": 16}
        )
    with pytest.raises(InvalidArgumentError, match="positive integer"):
        torchlower.export(
            CausalTCN(), x, tmp_path / "a.nnef.tgz", dynamic_axes={"x": {2: "T"}}, stream={"T": 0}
        )
    with pytest.raises(InvalidPulseError, match=r"valid pulses are 32, 64, 96, 128, … \(multiples of 32\)"):
        torchlower.export(
            model_of(KeywordSpotter), (torch.randn(1, 1024),), tmp_path / "k.nnef.tgz",
            dynamic_axes={"x": {1: "T"}}, stream={"T": 48},
        )  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_archive_without_stream_has_no_streaming_comment(tmp_path: Path) -> None:
    path = tmp_path / "plain.nnef.tgz"
    torchlower.export(CausalTCN(), (torch.randn(1, 4, 64),), path, dynamic_axes={"x": {2: "T"}})
    assert "# streaming" not in torchlower.artifact.io.graph_text(path)
    assert torchlower.inspect(path, tract=False)["streaming"] is None


def test_fast_state_gives_what_the_tract_package_gives(tmp_path: Path) -> None:
    """``nnef/pulse_ffi.FastState`` (tract's C calls without the package's per-call overhead)
    returns what ``State.run`` + ``to_numpy`` return, chunk after chunk; a chunk tract refuses
    is a TractError, not a crash (tract then invalidates the state, as through ``State.run``),
    and the arrays it returns are the caller's own."""
    import tract

    from torchlower.nnef import reader
    from torchlower.nnef.pulse import InProcessPulse
    from torchlower.nnef.pulse_ffi import FastState

    path = tmp_path / "tcn.nnef.tgz"
    x = (torch.randn(1, 4, 64),)
    torchlower.export(
        model_of(CausalTCN), x, path, dynamic_axes={"x": {2: "T"}}, check=False
    )  # compared here
    with reader.extracted(path) as folder:
        pulsed = InProcessPulse(Path(folder), "T", 8)
    fast, plain = FastState(pulsed.runnable.spawn_state()), pulsed.runnable.spawn_state()
    assert fast.direct
    rng = np.random.default_rng(0)
    kept = []
    for _ in range(5):
        chunk = rng.standard_normal((1, 4, 8)).astype(np.float32)
        (got,), (want,) = fast.run([chunk]), [t.to_numpy() for t in plain.run([chunk])]
        assert got.dtype == np.float32 and got.shape == (1, 8, 8) and np.array_equal(got, want)
        kept.append(got)
    assert len({a.ctypes.data for a in kept}) == 5 and all(a.flags.writeable for a in kept)
    with pytest.raises(tract.TractError):
        fast.run([np.zeros((1, 3, 8), np.float32)])
    with pytest.raises(tract.TractError, match="invalidated"):
        fast.run([chunk])
    fast, plain = FastState(pulsed.runnable.spawn_state()), pulsed.runnable.spawn_state()
    assert np.array_equal(fast.run([chunk])[0], plain.run([chunk])[0].to_numpy())


def test_real_package_model_streams(tmp_path: Path) -> None:
    """torchaudio's Wav2Letter (MFCC input: a stride-2 conv, then 'same' convs with look-ahead):
    exported with a stream at one pulse (three lengths), verified again at a second pulse."""
    pytest.importorskip("torchaudio")
    case = WAV2LETTER
    model = model_of(case.factory)
    path = tmp_path / "w2l.nnef.tgz"
    report = torchlower.export(
        model, (torch.randn(case.shape),), path, dynamic_axes={"x": {case.axis: "T"}},
        stream={"T": case.pulse},
    )  # fmt: skip
    s = report.stream
    assert (s.delay, s.multiple) == (case.delay, case.stride)
    assert len({p.length for p in s.points}) == 3
    assert all(e.ok and e.max_abs <= e.tolerance / 10 for p in s.points for e in p.errors)
    again = verify_stream(path, torchlower.load(path).graph, model, {"T": case.second})
    assert again.delay == case.delay and len(again.points) == 3
    assert all(e.max_abs <= e.tolerance / 10 for p in again.points for e in p.errors)

"""Streaming speed (issue 29): per-chunk latency and real-time factor of the streaming zoo in
tract's pulsed model at pulses of 10 ms and 20 ms (16 kHz audio, or 100 frames/s for models
that take frames), single thread, against running the whole sequence at once. Goal: the total
streamed compute ≤ 1.3× the whole-sequence run. Every archive is exported with ``stream=`` (so
verified chunk by chunk first); timings run in this process, interleaved, with the load average.
Each chunk is timed twice: through the ``tract`` package's ``State.run`` (outputs left as tract
tensors), and through torchlower's push path (``nnef/pulse_ffi.FastState``: tract's C calls,
outputs copied to numpy), which is what ``stream(...).push`` runs. bench/stream_floor.py
measures the fixed part of a chunk's cost.

    python -m bench.streaming [--seconds 4] [--rounds 5] [--out bench/results-issue29.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

for _k, _v in (("RAYON_NUM_THREADS", "1"), ("TRACT_FLASH_SDPA_ST", "1"), ("OMP_NUM_THREADS", "1")):
    os.environ.setdefault(_k, _v)

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import torchlower  # noqa: E402
from tests import streaming_models as zoo  # noqa: E402
from torchlower.nnef.pulse_ffi import FastState  # noqa: E402

# name → factory, example shape, dynamic axes, steps per second, pulses (10 ms, 20 ms)
CASES: dict[str, tuple[Any, tuple[int, ...], dict, int, tuple[int, int]]] = {
    "causal TCN (frames)": (zoo.CausalTCN, (1, 4, 64), {"x": {2: "T"}}, 100, (1, 2)),
    "log-mel + GRU KWS (16 kHz)": (zoo.KeywordSpotter, (1, 1024), {"x": {1: "T"}}, 16000, (160, 320)),
    "Conv-TasNet (16 kHz)": (zoo.ConvTasNet, (1, 1, 256), {"x": {2: "T"}}, 16000, (160, 320)),
    "LSTM tagger (frames)": (zoo.LSTMTagger, (1, 40, 8), {"x": {1: "T"}}, 100, (1, 2)),
    "strided depthwise (frames, stride 2)": (zoo.StridedDepthwise, (1, 8, 64), {"x": {2: "T"}}, 100, (2, 4)),
    "ConvSTFT denoiser (16 kHz)": (zoo.ConvSTFTDenoiser, (1, 1, 512), {"x": {2: "T"}}, 16000, (160, 320)),
    "stft/istft denoiser (16 kHz)": (zoo.STFTDenoiser, (1, 512), {"x": {1: "T"}}, 16000, (160, 320)),
    "torchaudio MFCC + GRU (16 kHz)": (zoo.MFCCSpotter, (1, 4000), {"x": {1: "T"}}, 16000, (160, 320)),
    "running sum (frames)": (zoo.RunningSum, (1, 4, 64), {"x": {2: "T"}}, 100, (1, 2)),
    "torchaudio mel + dB (16 kHz)": (zoo.MelDB, (1, 4000), {"x": {1: "T"}}, 16000, (160, 320)),
    "torchaudio Wav2Letter (MFCC frames, stride 2)": (
        zoo.wav2letter,
        (1, 13, 200),
        {"x": {2: "T"}},
        100,
        (2, 4),
    ),
}


def pulsed(path: Path, pulse: int) -> tuple[Any, int, int]:
    import tract

    model = tract.nnef().with_tract_extra().with_tract_transformers().with_pulse().load(str(path))
    model.transform(tract.Pulse(str(pulse), symbol="T"))
    delay = int(np.asarray(model.property("pulse.delay").to_numpy()).reshape(-1)[0])
    axis = int(np.asarray(model.property("pulse.input_axes").to_numpy()).reshape(-1)[0])
    return model.into_runnable(), delay, axis


def whole(path: Path) -> Any:
    import tract

    return tract.nnef().with_tract_extra().with_tract_transformers().load(str(path)).into_runnable()


def time_stream(runnable: Any, x: np.ndarray, axis: int, pulse: int, fast: bool) -> list[float]:
    """Per-chunk seconds of one pass over ``x``: the package's ``State.run``, or ``FastState``."""
    state = runnable.spawn_state()
    run = FastState(state).run if fast else state.run
    times = []
    for start in range(0, x.shape[axis] - pulse + 1, pulse):
        chunk = np.ascontiguousarray(np.take(x, np.arange(start, start + pulse), axis=axis))
        t0 = time.perf_counter()
        run([chunk])
        times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, (factory, shape, axes, rate, pulses) in CASES.items():
            model = zoo.model_of(factory)
            path = Path(tmp, "m.nnef.tgz")
            (axis_symbol,) = axes["x"].items()
            report = torchlower.export(
                model, (torch.randn(shape),), path, dynamic_axes=axes, stream={"T": pulses[0]}
            )
            steps = int(args.seconds * rate)
            full_shape = list(shape)
            full_shape[axis_symbol[0]] = steps
            x = np.random.default_rng(0).standard_normal(full_shape).astype(np.float32)
            full = whole(path)
            full.run([x])
            for pulse in pulses:
                runnable, delay, axis = pulsed(path, pulse)
                time_stream(runnable, x, axis, pulse, True)  # warm
                streamed, pushed, wholes, chunks, fast_chunks = [], [], [], [], []
                for _ in range(args.rounds):  # interleaved: State.run, FastState, then whole
                    t = time_stream(runnable, x, axis, pulse, False)
                    streamed.append(sum(t))
                    chunks.extend(t)
                    t = time_stream(runnable, x, axis, pulse, True)
                    pushed.append(sum(t))
                    fast_chunks.extend(t)
                    t0 = time.perf_counter()
                    full.run([x])
                    wholes.append(time.perf_counter() - t0)
                s, f, w = statistics.median(streamed), statistics.median(pushed), statistics.median(wholes)
                median, fast_median = 1e3 * statistics.median(chunks), 1e3 * statistics.median(fast_chunks)
                load, err = os.getloadavg()[0], report.stream.max_abs_error
                label = f"{1000 * pulse / rate:g} ms ({pulse})"
                rows.append(
                    (name, label, delay, median, fast_median, f / args.seconds, s / w, f / w, err, load)
                )
                print(rows[-1], flush=True)
    head = (
        "| model | pulse | delay | chunk median ms (State.run) | chunk median ms (push) | RTF (push)"
        " | streamed / whole (State.run) | streamed / whole (push) | max err | load |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [
            r[0],
            r[1],
            r[2],
            f"{r[3]:.3f}",
            f"{r[4]:.3f}",
            f"{r[5]:.4f}",
            f"{r[6]:.2f}×",
            f"{r[7]:.2f}×",
        ]
        lines.append("| " + " | ".join(map(str, [*cells, f"{r[8]:.2g}", f"{r[9]:.2f}"])) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(
            f"# Streaming speed (issue 29)\n\n`python -m bench.streaming --seconds {args.seconds:g}"
            f" --rounds {args.rounds}`, tract 0.23.9, 1 thread.\n\n" + text
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

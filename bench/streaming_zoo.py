"""The streaming zoo of the tests (tests/streaming_models.py ``ZOO``) at its two test pulses: the
delay, the largest error against PyTorch over the three input lengths of each pulse (absolute,
and relative to the output scale max(1, |output|)), and the real-time factor of torchlower's
push path (``stream(..., isolated=False)``, 1 thread) on 4 s of input — the closing table of
issue 29. The first pulse is verified by ``export(stream=)``, the second by ``verify_stream``
(``torchlower check --stream``).

    python -m bench.streaming_zoo [--seconds 4]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
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
from torchlower.artifact.stream_verify import verify_stream  # noqa: E402

# input steps per second: 16 kHz audio, or 100 frames/s (10 ms hop) for models that take frames
RATES = {"kws": 16000, "tasnet": 16000, "convstft_denoiser": 16000, "stft_denoiser": 16000,
         "torchaudio_mfcc": 16000, "torchaudio_mel_db": 16000}  # fmt: skip


def errors(report: Any) -> tuple[float, float]:
    """Largest absolute error and largest error over the output scale (tolerance = 1e-4 × scale)."""
    pairs = [(e.max_abs, e.max_abs / (e.tolerance / 1e-4)) for p in report.points for e in p.errors]
    return max(a for a, _ in pairs), max(r for _, r in pairs)


def rtf(path: Path, case: zoo.Case, pulse: int, seconds: float) -> tuple[float, float, float]:
    """Real-time factor (total chunk time), the same from the median chunk (preemption spikes
    left out: the load is shared), and the median chunk µs, of one pass over ``seconds``."""
    rate = RATES.get(case.name, 100)
    shape = list(case.shape)
    shape[case.axis] = int(seconds * rate)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    with torchlower.load(path).stream({"T": pulse}, isolated=False) as stream:
        stream.run({"x": x})  # warm
        result = stream.run({"x": x})
    median = float(np.median(result.chunk_seconds))
    return result.real_time_factor(rate), median * result.chunks / seconds, 1e6 * median


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("load before:", os.getloadavg(), flush=True)
    lines = [
        "| model | delay | pulse | max abs err | max err / scale | RTF | RTF (median chunk) | chunk median µs"
        " | load |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for case in [*zoo.ZOO, zoo.WAV2LETTER]:
            model = zoo.model_of(case.factory)
            path = Path(tmp, f"{case.name}.nnef.tgz")
            axes = {"x": {case.axis: "T"}}
            report = torchlower.export(model, (torch.randn(case.shape),), path, dynamic_axes=axes,
                                       stream={"T": case.pulse})  # fmt: skip
            again = verify_stream(path, torchlower.load(path).graph, model, {"T": case.second})
            for pulse, r in ((case.pulse, report.stream), (case.second, again)):
                (abs_err, rel_err), (factor, steady, chunk) = errors(r), rtf(path, case, pulse, args.seconds)
                row = [case.name, r.delay, pulse, f"{abs_err:.2g}", f"{rel_err:.2g}", f"{factor:.4f}",
                       f"{steady:.4f}", f"{chunk:.0f}", f"{os.getloadavg()[0]:.1f}"]  # fmt: skip
                lines.append("| " + " | ".join(map(str, row)) + " |")
                print(lines[-1], flush=True)
    print("load after:", os.getloadavg())
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""tract's fixed per-chunk cost (issue 29): what one ``push`` of a pulsed model costs when the
model does almost nothing (``x * 2`` on one channel), layer by layer from tract's C call to
``Stream.push`` through the child process. A zoo row whose chunk time sits near this floor
cannot get closer to the whole-sequence run by a faster lowering. Single thread, the levels
interleaved round by round, the load average printed.

    python -m bench.stream_floor [--pushes 2000] [--rounds 7] [--pulses 1,160]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

for _k, _v in (("RAYON_NUM_THREADS", "1"), ("TRACT_FLASH_SDPA_ST", "1"), ("OMP_NUM_THREADS", "1")):
    os.environ.setdefault(_k, _v)

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

import torchlower  # noqa: E402
from torchlower.artifact import runner  # noqa: E402
from torchlower.nnef import reader  # noqa: E402
from torchlower.nnef.pulse import InProcessPulse, PulseSession  # noqa: E402
from torchlower.nnef.pulse_ffi import FastState  # noqa: E402


class Double(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2.0


def levels(path: Path, folder: Path, pulse: int) -> tuple[dict[str, Callable[[], Any]], list[Any]]:
    """name → one push at that level; the objects to close afterwards."""
    import tract
    from tract.bindings import lib

    chunk = np.random.default_rng(0).standard_normal((1, 1, pulse)).astype(np.float32)
    here = InProcessPulse(folder, "T", pulse)
    state = here.runnable.spawn_state()
    tensor = tract.Tensor.from_numpy(chunk)
    ins, outs = (ctypes.c_void_p * 1)(tensor.ptr), (ctypes.c_void_p * 1)()

    def ffi() -> None:  # tract_state_run alone (the input tensor reused: tract does not own it)
        lib.tract_state_run(state.ptr, ins, outs)
        lib.tract_tensor_destroy(ctypes.byref(ctypes.c_void_p(outs[0])))

    child = PulseSession(folder, "T", pulse, threads=1)
    art = torchlower.load(path)
    stream_here = art.stream({"T": pulse}, isolated=False)
    stream_child = art.stream({"T": pulse}, threads=1)
    fast = FastState(here.runnable.spawn_state())
    old_state = here.runnable.spawn_state()

    def before() -> Any:  # Stream.push as it was: every chunk checked, State.run + to_numpy
        stream_here.accepted = None
        arrays = stream_here.checked({"x": chunk})
        return runner.outputs_by_name(["output"], [t.to_numpy() for t in old_state.run(arrays)])

    plain = tract.nnef().with_tract_extra().load(str(folder))
    plain.transform(tract.SetSymbols({"T": pulse}))
    whole = plain.into_runnable()
    found = {
        "tract_state_run (ctypes, tensor reused)": ffi,
        "State.run(tract.Tensor)": lambda: state.run([tensor]),
        "State.run(ndarray)": lambda: state.run([chunk]),
        "State.run(ndarray) + to_numpy": lambda: [t.to_numpy() for t in state.run([chunk])],
        "unpulsed Runnable.run + to_numpy (same chunk)": lambda: [t.to_numpy() for t in whole.run([chunk])],
        "FastState.run (pulse_ffi: the C calls directly)": lambda: fast.run([chunk]),
        "InProcessPulse.push (FastState)": lambda: here.push([chunk]),
        "Stream.push, isolated=False, before (checks + State.run + to_numpy)": before,
        "Stream.push, isolated=False (checks cached, FastState)": lambda: stream_here.push({"x": chunk}),
        "PulseSession.push (child, FastState)": lambda: child.push([chunk]),
        "Stream.push (child)": lambda: stream_child.push({"x": chunk}),
    }
    return found, [here, child, stream_here, stream_child]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pushes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--pulses", default="1,160")
    args = parser.parse_args()
    print("uptime before:", os.getloadavg())
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "double.nnef.tgz")
        torchlower.export(
            Double(), (torch.randn(1, 1, 64),), path, dynamic_axes={"x": {2: "T"}}, stream={"T": 16}
        )
        with reader.extracted(path) as folder:
            for pulse in [int(p) for p in args.pulses.split(",")]:
                found, opened = levels(path, Path(folder), pulse)
                times: dict[str, list[float]] = {k: [] for k in found}
                cpu: dict[str, list[float]] = {k: [] for k in found}
                child_tract: list[float] = []
                for _ in range(args.rounds):
                    for name, push in found.items():
                        for _ in range(50):
                            push()  # warm
                        start, start_cpu = time.perf_counter(), time.process_time()
                        for _ in range(args.pushes):
                            push()
                        times[name].append((time.perf_counter() - start) / args.pushes)
                        cpu[name].append((time.process_time() - start_cpu) / args.pushes)
                    session = opened[1]
                    child_tract.append(statistics.median(session.seconds[-args.pushes :]))
                for name, t in times.items():
                    rows.append((pulse, name, 1e6 * statistics.median(t), 1e6 * min(t), 1e6 * min(cpu[name])))
                rows.append((pulse, "  tract's time inside the child (its perf_counter)",
                             1e6 * statistics.median(child_tract), 1e6 * min(child_tract), None))  # fmt: skip
                for o in opened:
                    o.close()
    print("uptime after:", os.getloadavg())
    print("| pulse | level | µs per push (median of rounds) | best round | this process's CPU µs (best) |")
    print("|---|---|---|---|---|")
    for pulse, name, med, best, used in rows:
        shown = "–" if used is None else f"{used:.1f}"
        print(f"| {pulse} | {name} | {med:.1f} | {best:.1f} | {shown} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

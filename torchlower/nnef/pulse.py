"""tract's pulse transform: an archive with a streaming axis run as a stateful model, one chunk
at a time (``torchlower.load(path).stream(...)``, ``export(..., stream=...)``).

As for ``nnef/session.py``, tract lives in a child process (``python -m torchlower.nnef.pulse
FOLDER SYMBOL PULSE``): it can abort instead of raising, and its thread pool reads
``RAYON_NUM_THREADS`` once per process. The child loads the archive with tract's pulse
registry, applies ``tract.Pulse(PULSE, symbol=SYMBOL)``, reads the delay and the streaming axes
(before ``into_runnable``, which consumes the model), then answers one message per chunk with
the chunk's outputs and the time tract spent on it. ``reset`` starts a fresh state.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from torchlower.errors import CheckError
from torchlower.nnef.graph_model import Graph, Ident
from torchlower.nnef.pulse_ffi import FastState
from torchlower.nnef.session import Child, receive, send, short

_STRIDE = re.compile(r"requires pulse \((\d+)\) to be a stride \((\d+)\) multiple")
_NODE = re.compile(r'Translating node #\d+ "([^"]+)" (\w+)')


@dataclass(frozen=True)
class PulseFacts:
    """What tract says about a pulsed model: the delay (in steps of each output's streaming
    axis), the streaming axis of every input and output, and the pulsed shapes."""

    delays: list[int]  # one per output, or one for all
    input_axes: list[int]
    output_axes: list[int]
    inputs: list[str]  # tract's facts of the pulsed model: "1,4,16,f32"
    outputs: list[str]

    def per_output(self, count: int) -> list[int]:
        return list(self.delays) if len(self.delays) == count else [max(self.delays, default=0)] * count


class PulseRefused(CheckError):
    """tract could not pulse the model; ``node``/``op`` name where, ``stride`` is set when the
    pulse is not a multiple of a stride (``pulse`` is then the pulse that node would see)."""

    def __init__(self, message: str, node: str = "", op: str = "", stride: int = 0, pulse: int = 0) -> None:
        self.node, self.op, self.stride, self.pulse = node, op, stride, pulse
        super().__init__(message)


def hazards(graph: Graph, symbol: str) -> list[str]:
    """What tract 0.23.9 pulses without complaint and streams wrong: a strided ``deconv`` (its
    pulsed delay is counted in input frames, not output steps: a ``ConvTranspose1d`` of stride 8
    reports 1 where the stream lags 8). torchlower's streaming exports write these as a conv and
    an interleave instead (``nnef/stream_forms.py``)."""
    found = []
    for a in graph.assignments:
        stride = a.attrs.get("stride") or []
        if a.op == "deconv" and any(isinstance(s, int) and s > 1 for s in stride):
            where = f"module {a.scope!r}, " if a.scope else ""
            found.append(
                f"graph.nnef line {a.line} ({where}{a.outputs[0]} = deconv, stride {list(stride)}): tract"
                f" pulses a strided transposed convolution over {symbol} with a wrong delay (counted in"
                " input frames); export the model again with torchlower.export(..., stream=...), which"
                " writes it in a form that streams correctly"
            )
    return found


def unverified_hazards(graph: Graph) -> list[str]:
    """What tract pulses chunk-locally, so wrong, and torchlower cannot tell apart statically
    from a safe use: a ``matmul`` of two computed operands (attention ``Q·Kᵀ`` over the streaming
    axis pulses as attention within each chunk). ``load(...).stream`` refuses it on archives no
    ``export(stream=...)`` verified; a verified archive streamed it right."""
    weights = {o for a in graph.assignments if a.op.startswith("variable") for o in a.outputs}
    found = []
    for a in graph.assignments:
        operands = [x for x in a.args[:2] if isinstance(x, Ident)]
        if a.op == "matmul" and len(operands) == 2 and not any(x.name in weights for x in operands):
            where = f"module {a.scope!r}, " if a.scope else ""
            found.append(
                f"graph.nnef line {a.line} ({where}{a.outputs[0]} = matmul of two computed tensors):"
                " attention over the streaming axis needs every step (tract pulses it within each chunk,"
                " which is wrong); it was never verified (export with stream=... to verify it)"
            )
    return found


def where_is(graph: Graph, node: str) -> str:
    """``graph.nnef line 12 (module 'enc.pool', mean = mean_reduce)`` for a tract node name
    (tract names a node after the NNEF identifier it computes, plus suffixes of its own)."""
    best = None
    for a in graph.assignments:
        for out in a.outputs:
            if (node == out or node.startswith(out + "_") or node.startswith(out + ".")) and (
                best is None or len(out) > len(best[1])
            ):
                best = (a, out)
    if best is None:
        return f"node {node!r}"
    a, out = best
    scope = f"module {a.scope!r}, " if a.scope else ""
    return f"graph.nnef line {a.line} ({scope}{out} = {a.op})"


def pulse_floor(graph: Graph) -> int:
    """A multiple every pulse must be that tract does not enforce itself: the hop of each
    ``tract_core_stft`` (tract 0.23.9 pulses an STFT of hop 32 at 48 and streams wrong frames,
    and at 1 it fails with a huge shape)."""
    out = 1
    for a in graph.assignments:
        if a.op == "tract_core_stft" and isinstance(a.attrs.get("stride"), int) and a.attrs["stride"] > 0:
            out = math.lcm(out, a.attrs["stride"])
    return out


# ---- child side --------------------------------------------------------------------------
def _pulsed(folder: str, symbol: str, pulse: int) -> tuple[Any, PulseFacts]:
    import tract

    model = tract.nnef().with_tract_extra().with_tract_transformers().with_onnx().with_pulse().load(folder)
    model.transform(tract.Pulse(str(pulse), symbol=symbol))

    def ints(name: str) -> list[int]:
        return [int(v) for v in np.asarray(model.property(name).to_numpy()).reshape(-1)]

    facts = PulseFacts(
        ints("pulse.delay"),
        ints("pulse.input_axes"),
        ints("pulse.output_axes"),
        [str(model.input_fact(i)) for i in range(model.input_count())],
        [str(model.output_fact(i)) for i in range(model.output_count())],
    )
    return model.into_runnable(), facts


def serve(folder: str, symbol: str, pulse: int) -> int:
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print in a library must not corrupt the protocol
    requests = os.fdopen(0, "rb")
    try:
        runnable, facts = _pulsed(folder, symbol, pulse)
        state = FastState(runnable.spawn_state())
    except Exception as exc:  # tract raises TractError; reported as text to the parent
        send(replies, {"error": short(exc)}, [])
        return 3
    send(replies, {"error": None, "facts": facts.__dict__}, [])
    while (message := receive(requests)) is not None:
        header, inputs = message
        if header.get("op") == "reset":
            state = FastState(runnable.spawn_state())
            send(replies, {"error": None}, [])
            continue
        try:
            start = time.perf_counter()
            outputs = state.run(inputs)
            seconds = time.perf_counter() - start
        except Exception as exc:
            send(replies, {"error": short(exc)}, [])
            continue
        send(replies, {"error": None, "seconds": seconds}, outputs)
    return 0


# ---- parent side -------------------------------------------------------------------------
class PulseSession:
    """A pulsed tract model of one archive folder, in a child process; ``push`` one chunk at a
    time (state kept between calls), ``reset`` to start a new stream. ``folder`` may be deleted
    once the constructor returns."""

    def __init__(self, folder: Path, symbol: str, pulse: int, threads: int | None = None) -> None:
        self.folder, self.symbol, self.pulse = Path(folder).resolve(), symbol, pulse
        self.lock = threading.Lock()
        threads = threads or int(os.environ.get("RAYON_NUM_THREADS", "1"))  # one unless told
        self.child = Child("torchlower.nnef.pulse", [str(self.folder), symbol, str(pulse)], threads)
        header, _ = self._exchange(None, {}, "pulse")
        self.facts = PulseFacts(**header["facts"])
        self.seconds: list[float] = []  # tract's time per pushed chunk

    def push(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One chunk of every input (already checked) → that chunk's outputs."""
        with self.lock:
            header, outputs = self._exchange(inputs, {"op": "run"}, "run")
        self.seconds.append(float(header["seconds"]))
        return outputs

    def reset(self) -> None:
        with self.lock:
            self._exchange([], {"op": "reset"}, "reset")

    def _exchange(
        self, inputs: Sequence[np.ndarray] | None, header: dict[str, Any], what: str
    ) -> tuple[dict[str, Any], list[Any]]:
        if self.child.proc is None:
            raise CheckError("the tract process of this stream stopped earlier; open the stream again")
        reply = self.child.exchange(header, inputs, f"tract could not {what} {self.folder}")
        error = reply[0]["error"]
        if error is not None:
            if what == "pulse":
                self.close()
                raise refusal(error, self.pulse)
            raise CheckError(f"tract could not {what} the pulsed model: {error}")
        return reply

    def close(self) -> None:
        self.child.stop()

    def __enter__(self) -> PulseSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.close()


class InProcessPulse:
    """``PulseSession``'s interface with tract in this process (``stream(..., isolated=False)``):
    the lowest per-chunk cost (no pipe), no protection from an abort, threads from the
    environment."""

    def __init__(self, folder: Path, symbol: str, pulse: int) -> None:
        self.folder, self.symbol, self.pulse = Path(folder), symbol, pulse
        try:
            self.runnable, self.facts = _pulsed(str(folder), symbol, pulse)
        except Exception as exc:
            raise refusal(short(exc), pulse) from None
        self.state: FastState | None = FastState(self.runnable.spawn_state())
        self.seconds: list[float] = []

    def push(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        if self.state is None:
            raise CheckError("this stream was closed; open it again")
        start = time.perf_counter()
        try:
            outputs = self.state.run(inputs)
        except Exception as exc:
            raise CheckError(f"tract could not run the pulsed model: {short(exc)}") from None
        self.seconds.append(time.perf_counter() - start)
        return outputs

    def reset(self) -> None:
        self.state = FastState(self.runnable.spawn_state())

    def close(self) -> None:
        self.state = self.runnable = None

    def __enter__(self) -> InProcessPulse:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def refusal(error: str, pulse: int) -> PulseRefused:
    """tract's pulse error as a ``PulseRefused`` naming the node and, for a stride, the stride."""
    node = _NODE.search(error)
    stride = _STRIDE.search(error)
    text = error.replace("\n\nCaused by:\n", " — ").replace("\n", " ").strip()
    return PulseRefused(
        f"tract cannot pulse the model at {pulse}: {text}",
        node.group(1) if node else "",
        node.group(2) if node else "",
        int(stride.group(2)) if stride else 0,
        int(stride.group(1)) if stride else 0,
    )


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1], sys.argv[2], int(sys.argv[3])))

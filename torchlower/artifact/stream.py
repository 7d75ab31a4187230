"""``torchlower.load(path).stream({"T": 32})``: an archive run as a stream, one chunk at a time.

tract's pulse transform (``nnef/pulse.py``, a child process) turns the archive into a stateful
model that takes ``pulse`` steps of the streaming axis per call. ``push`` checks a chunk like
``run`` checks inputs (names, dtype, rank, fixed sizes, and the chunk length along the streaming
axis), returns that chunk's outputs and keeps the state; outputs lag the input by ``delay``
steps of each output's streaming axis. ``reset`` starts a new stream; ``run`` streams a whole
input and returns the delay-aligned outputs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from torchlower.artifact import runner
from torchlower.errors import InvalidArgumentError, StreamingError
from torchlower.nnef import reader
from torchlower.nnef.graph_model import Graph
from torchlower.nnef.pulse import InProcessPulse, PulseSession, hazards, pulse_floor, unverified_hazards
from torchlower.pipeline import stream_check


@dataclass
class StreamRun:
    """A whole input streamed: the delay-aligned outputs and tract's time per chunk."""

    outputs: dict[str, np.ndarray]
    steps: int  # input steps along the streaming axis
    chunks: int
    chunk_seconds: list[float] = field(default_factory=list)

    def real_time_factor(self, rate: float) -> float:
        """tract's compute time over the input's duration at ``rate`` steps per second."""
        return sum(self.chunk_seconds) / (self.steps / rate) if self.steps else 0.0


class Stream:
    """A pulsed tract model of one archive: ``push`` one chunk per call (``.pulse`` steps of the
    streaming axis of every streamed input), outputs ``.delay`` steps late."""

    def __init__(
        self, path: Path, graph: Graph, pulses: Any, threads: int | None = None, isolated: bool = True
    ) -> None:
        if threads is not None and not isolated:
            raise InvalidArgumentError(
                "threads= needs isolated=True: tract's thread pool reads RAYON_NUM_THREADS once per"
                " process; set that variable before the first run instead"
            )
        self.path, self.graph = Path(path), graph
        self.symbol, self.pulse = stream_check.stream_argument(
            pulses, axes_of(graph), True, [d.name for d in graph.inputs], archive=True
        ) or ("", 0)
        recorded = graph.streaming if graph.streaming.get("symbol") == self.symbol else {}
        found = hazards(graph, self.symbol) + ([] if recorded else unverified_hazards(graph))
        if found:
            raise StreamingError(f"{path} cannot stream over {self.symbol}: {found[0]}")
        with reader.extracted(self.path) as folder:
            self.session: PulseSession | InProcessPulse = stream_check.open_pulsed(
                folder,
                self.symbol,
                self.pulse,
                recorded.get("multiple"),
                str(path),
                threads,
                pulse_floor(graph),
                graph,
                isolated,
            )
        facts = self.session.facts
        self.input_axes = dict(zip([d.name for d in graph.inputs], facts.input_axes, strict=True))
        self.output_axes = dict(zip(graph.outputs, facts.output_axes, strict=True))
        self.delays = dict(zip(graph.outputs, facts.per_output(len(graph.outputs)), strict=True))
        self.delay = self.delays[graph.outputs[0]] if graph.outputs else 0
        self.output_pulses = {
            n: _pulse_of(f, self.output_axes[n]) for n, f in zip(graph.outputs, facts.outputs, strict=True)
        }
        self.verified = recorded  # what export(stream=) recorded, {} when never verified
        # the tract_assert bounds a chunk must meet (the streaming symbol's apply to the whole
        # stream, not to one chunk), and the (dtype, shape) of the last chunk that passed
        self.bounds = [
            e for e in graph.extensions if not e.strip().startswith(f"tract_assert {self.symbol} ")
        ]
        self.accepted: tuple[tuple[np.dtype, tuple[int, ...]], ...] | None = None

    @property
    def chunk_seconds(self) -> list[float]:
        return list(self.session.seconds)

    def push(self, inputs: Mapping[str, Any] | Sequence[Any] | np.ndarray) -> dict[str, np.ndarray]:
        """One chunk of every input in, that chunk's outputs out (state kept between calls)."""
        arrays = self.checked(inputs)
        return runner.outputs_by_name(self.graph.outputs, self.session.push(arrays))

    def checked(self, inputs: Mapping[str, Any] | Sequence[Any] | np.ndarray) -> list[np.ndarray]:
        """The chunk's arrays, checked like ``run``'s inputs; a chunk of the dtypes and shapes of
        the last one that passed is not checked again (the checks depend on nothing else, and
        at ~50 µs they cost as much as tract's run of a small chunk)."""
        decls = self.graph.inputs
        arrays = runner.as_list(inputs, decls)
        key = tuple((a.dtype, a.shape) for a in arrays)
        if key == self.accepted:
            return arrays
        for decl, array in zip(decls, arrays, strict=True):
            axis = self.input_axes[decl.name]
            if array.ndim == len(decl.shape) and array.shape[axis] != self.pulse:
                raise InvalidArgumentError(
                    f"input {decl.name!r} axis {axis} is the streaming axis ({self.symbol}): each chunk"
                    f" must have {self.pulse} steps (the pulse), got {array.shape[axis]}; pad the last"
                    " chunk with zeros"
                )
        runner.bind(decls, arrays, self.graph.symbols, self.bounds)
        self.accepted = key
        return arrays

    def reset(self) -> None:
        """Forget the state: the next ``push`` starts a new stream."""
        self.session.reset()

    def run(self, inputs: Mapping[str, Any] | Sequence[Any] | np.ndarray) -> StreamRun:
        """Stream whole inputs from a fresh state: their chunks, then zero chunks until every
        output has ``delay`` more steps; each output aligned (its first ``delay`` steps dropped)
        and cut to the steps its input covers (``steps × output pulse / pulse``)."""
        decls = self.graph.inputs
        arrays = runner.as_list(inputs, decls)
        steps = {arrays[i].shape[self.input_axes[d.name]] for i, d in enumerate(decls)}
        if len(steps) != 1:
            raise InvalidArgumentError(f"the streamed inputs have different lengths {sorted(steps)}")
        (length,) = steps
        self.reset()
        start = len(self.session.seconds)
        want = {n: -(-length * self.output_pulses[n] // self.pulse) for n in self.graph.outputs}
        have = dict.fromkeys(self.graph.outputs, 0)
        pieces: list[dict[str, np.ndarray]] = []
        k = 0
        while k * self.pulse < length or any(have[n] < want[n] + self.delays[n] for n in have):
            chunk = {d.name: stream_check.chunk_of(a, self.input_axes[d.name], k * self.pulse, self.pulse)
                     for d, a in zip(decls, arrays, strict=True)}  # fmt: skip
            outs = self.push(chunk)
            pieces.append(outs)
            for n, o in outs.items():
                have[n] += o.shape[self.output_axes[n]]
            k += 1
        outputs = {}
        for n in self.graph.outputs:
            axis, d = self.output_axes[n], self.delays[n]
            whole = np.concatenate([p[n] for p in pieces], axis=axis)
            outputs[n] = np.take(whole, np.arange(d, d + want[n]), axis=axis)
        self.reset()
        return StreamRun(outputs, length, k, self.session.seconds[start:])

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def axes_of(graph: Graph) -> dict[str, dict[int, str]]:
    """The plain symbols of each input's declared shape (``[1, 4, T]`` → ``{"x": {2: "T"}}``)."""
    return {d.name: {i: dim for i, dim in enumerate(d.shape) if isinstance(dim, str)} for d in graph.inputs}


def _pulse_of(fact: str, axis: int) -> int:
    dims = fact.split(",")[:-1]
    return int(dims[axis]) if axis < len(dims) and dims[axis].strip().isdigit() else 0


def open_stream(
    path: Path, graph: Graph, pulses: Any, threads: int | None = None, isolated: bool = True
) -> Stream:
    return Stream(path, graph, pulses, threads, isolated)

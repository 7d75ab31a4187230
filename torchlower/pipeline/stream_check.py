"""The streaming check of ``export(..., stream={"T": 16})``: the written archive pulsed in tract
at that pulse and run chunk by chunk, compared with PyTorch on the whole input.

For each checked input (the example and fresh random inputs of other lengths) the chunks of the
input are pushed, then zero chunks until every output has ``delay`` steps more than PyTorch's
whole-input output. The concatenated outputs, shifted by tract's delay, are compared with PyTorch
run on the same signal as one sequence: the input followed by the zeros that were pushed (near
the end of the input PyTorch would see the end of the sequence — zero padding, a last frame —
which a stream cannot know of; on the input extended by what was actually streamed both see the
same samples). The comparison covers at least the whole-input output's length.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchlower.core import dynamic
from torchlower.core.comparison import OutputError, compare
from torchlower.errors import CheckError, InvalidArgumentError, InvalidPulseError, StreamingError
from torchlower.nnef.graph_model import Graph
from torchlower.nnef.pulse import (
    InProcessPulse,
    PulseFacts,
    PulseRefused,
    PulseSession,
    unverified_hazards,
    where_is,
)
from torchlower.pipeline import verification

MAX_PROBES = 8  # pulses tried to find the smallest one tract accepts


@dataclass
class StreamPoint:
    """One streamed input: its length, the chunks pushed and the errors per output."""

    label: str
    length: int
    chunks: int
    errors: list[OutputError]


@dataclass
class StreamReport:
    """``report.stream``: the verified pulse and what tract said about it."""

    symbol: str
    pulse: int
    delay: int  # steps of the first output's streaming axis
    multiple: int  # every pulse that is a multiple of this one is accepted by tract
    input_axes: dict[str, int]
    output_axes: dict[str, int]
    delays: dict[str, int]  # per output
    points: list[StreamPoint] = field(default_factory=list)
    chunk_seconds: list[float] = field(default_factory=list)  # tract's time per pushed chunk

    @property
    def max_abs_error(self) -> float:
        return max((e.max_abs for p in self.points for e in p.errors), default=0.0)

    @property
    def mean_chunk_seconds(self) -> float:
        return sum(self.chunk_seconds) / len(self.chunk_seconds) if self.chunk_seconds else 0.0

    def note(self) -> str:
        """The archive comment ``inspect`` and ``load().stream`` read back."""
        ins = ",".join(f"{n}:{a}" for n, a in self.input_axes.items())
        outs = ",".join(f"{n}:{a}:{self.delays[n]}" for n, a in self.output_axes.items())
        return (
            f"{self.symbol} pulse={self.pulse} delay={self.delay} multiple={self.multiple}"
            f" inputs={ins} outputs={outs}"
        )


def stream_argument(
    stream: Any,
    axes: Mapping[str, Mapping[int, str]],
    check: bool,
    names: Sequence[str] = (),
    archive: bool = False,
) -> tuple[str, int] | None:
    """``{"T": 16}`` → ``("T", 16)``: one symbol of the dynamic axes and a positive pulse, which
    every input of ``names`` carries."""
    if stream is None:
        return None
    if not check:
        raise InvalidArgumentError("stream= is verified by the check, and check=False turns it off")
    symbols = sorted({s for by_axis in axes.values() for s in by_axis.values()})
    if not isinstance(stream, Mapping) or len(stream) != 1:
        raise InvalidArgumentError(
            f"stream must be a dict {{symbol: pulse}} with one symbol, e.g. {{'T': 16}}; got {stream!r}"
        )
    ((symbol, pulse),) = stream.items()
    if symbol not in symbols:
        fix = (
            f" declare the streaming axis first, e.g. dynamic_axes={{'x': {{2: {symbol!r}}}}}"
            if not archive
            else " name one of those (the archive declares no other symbol in its inputs)"
        )
        raise InvalidArgumentError(
            f"stream names {symbol!r}, which is not a symbol of the dynamic axes"
            f" {symbols or '(none given)'}:{fix}"
        )
    if isinstance(pulse, bool) or not isinstance(pulse, int) or pulse < 1:
        raise InvalidArgumentError(f"stream pulse of {symbol!r} must be a positive integer, got {pulse!r}")
    unstreamed = [n for n in names if symbol not in axes.get(n, {}).values()]
    if unstreamed:
        raise StreamingError(
            f"input {unstreamed[0]!r} has no {symbol} axis: tract's pulse streams every input, chunk by"
            f" chunk; make it a constant of the model (an LSTM/GRU initial state as a buffer:"
            f" register_buffer('h0', ...)) or give it a {symbol} axis"
        )

    return symbol, pulse


def smallest_pulse(artifact: Path, symbol: str, pulse: int, floor: int = 1) -> int:
    """The smallest pulse tract accepts (a multiple of every stride on the way), probing from
    ``floor`` (``nnef.pulse.pulse_floor``: what tract does not check itself)."""
    candidate = floor
    for _ in range(MAX_PROBES):
        try:
            PulseSession(artifact, symbol, candidate).close()
            return candidate
        except PulseRefused as exc:
            if not exc.stride or not exc.pulse:
                return pulse  # refused for another reason: the pulse asked for decides
            # the node sees candidate / U steps for the strides U before it: U * lcm(its pulse, stride)
            candidate = candidate * exc.stride // math.gcd(exc.pulse, exc.stride)
            candidate = math.lcm(candidate, floor)
    return pulse


def open_pulsed(
    artifact: Path,
    symbol: str,
    pulse: int,
    multiple: int | None,
    where: str,
    threads: int | None = None,
    floor: int = 1,
    graph: Graph | None = None,
    isolated: bool = True,
) -> PulseSession | InProcessPulse:
    """A ``PulseSession``, tract's refusals as typed errors (a pulse the strides do not allow
    lists the valid ones; any other refusal is a ``StreamingError`` naming the op)."""
    if (multiple or floor) and pulse % math.lcm(multiple or 1, floor):
        raise InvalidPulseError(invalid_pulse(symbol, pulse, math.lcm(multiple or 1, floor), where))
    try:
        if not isolated:
            return InProcessPulse(artifact, symbol, pulse)
        return PulseSession(artifact, symbol, pulse, threads)
    except PulseRefused as exc:
        if exc.stride:
            valid = multiple or smallest_pulse(artifact, symbol, pulse, floor)
            raise InvalidPulseError(invalid_pulse(symbol, pulse, valid, where)) from None
        at = f" at {where_is(graph, exc.node)}" if graph is not None and exc.node else ""
        why = refusal_reason(str(exc))
        raise StreamingError(f"{where} cannot stream over {symbol}{at}{why}: {exc}") from None


def refusal_reason(text: str) -> str:
    """Why tract's pulse refusal means the model cannot stream, in words, and the fix if any."""
    if "Reflect padding" in text:
        return (
            " (reflect padding of the whole signal, as torch.stft(center=True) pads, needs its end:"
            " use center=False, or pad the signal before the model)"
        )
    if "could not track pulsing axis" in text or "No specific pulse" in text:
        return (
            " (an op over the whole streaming axis — a reduction or global pooling over it, attention"
            " over every step — needs the whole sequence)"
        )
    return ""


def invalid_pulse(symbol: str, pulse: int, multiple: int, where: str) -> str:
    shown = ", ".join(str(multiple * k) for k in range(1, 5))
    return (
        f"{where}: a pulse of {pulse} steps of {symbol} is not a multiple of the model's total stride"
        f" {multiple}; valid pulses are {shown}, … (multiples of {multiple})"
    )


def stream_lengths(spec: dynamic.Spec, symbol: str, pulse: int) -> list[int]:
    """The example's value of ``symbol`` and two others: longer by a pulse and 3 steps, and
    about half (within the declared bounds)."""
    base = spec.base[symbol]
    lo, hi = spec.bounds.get(symbol, (1, None))
    out = [base]
    for n in (base + pulse + 3, max(base // 2 + 1, lo or 1)):
        if (hi is None or n <= hi) and n >= (lo or 1) and n not in out:
            out.append(n)
    return out


Points = list[tuple[str, tuple[torch.Tensor, ...]]]


def export_points(example: tuple[torch.Tensor, ...], spec: dynamic.Spec, symbol: str, pulse: int) -> Points:
    """The example, and random inputs like it at the other lengths of ``stream_lengths``."""
    points: Points = [("example", example)]
    for k, n in enumerate(stream_lengths(spec, symbol, pulse)[1:], start=1):
        g = torch.Generator().manual_seed(verification.SEED + 100 + k)
        resized = spec.example_at(example, {**spec.base, symbol: n})
        label = f"{symbol}={n} (random, seed {verification.SEED + 100 + k})"
        points.append((label, tuple(verification.like(t, g) for t in resized)))
    return points


def check_stream(
    artifact: Path,
    run: Callable[[Sequence[torch.Tensor]], list[torch.Tensor]],
    points: Points,
    input_names: Sequence[str],
    output_names: Sequence[str],
    symbol: str,
    pulse: int,
    tol: Callable[[Sequence[Any]], float],
    shown: Path,
    multiple: int | None = None,
    floor: int = 1,
    graph: Graph | None = None,
) -> StreamReport:
    """Pulse ``artifact`` at ``pulse``, stream every point's inputs, compare with ``run`` on the
    streamed signal; a mismatch is a ``CheckError`` (its ``errors`` are every output's at every
    point). ``multiple`` (the smallest pulse tract accepts) is probed when not given."""
    multiple = multiple or smallest_pulse(artifact, symbol, pulse, floor)
    with open_pulsed(artifact, symbol, pulse, multiple, str(shown), None, floor, graph) as session:
        facts = session.facts
        report = stream_report(facts, symbol, pulse, multiple, input_names, output_names)
        for label, inputs in points:
            session.reset()
            report.points.append(stream_point(session, facts, run, label, inputs, output_names, tol))
        report.chunk_seconds = list(session.seconds)
    bad = [(p, e) for p in report.points for e in p.errors if not e.ok]
    if bad:
        detail = "; ".join(
            f"{p.label}: {e.name} max abs {e.max_abs:.3g} > {e.tolerance:.3g}" for p, e in bad[:4]
        )
        found = (
            f"{shown}: streamed in tract at a pulse of {pulse} ({symbol}, delay {report.delay}), the"
            f" outputs differ from PyTorch on the whole input — {detail}"
        )
        suspects = unverified_hazards(graph) if graph is not None else []
        if suspects:  # attention over the streaming axis: the model cannot stream, say where
            raise StreamingError(f"{found}. The model cannot stream over {symbol}: {suspects[0]}")
        raise CheckError(found, [e for p in report.points for e in p.errors])
    return report


def stream_report(
    facts: PulseFacts,
    symbol: str,
    pulse: int,
    multiple: int,
    input_names: Sequence[str],
    output_names: Sequence[str],
) -> StreamReport:
    delays = facts.per_output(len(output_names))
    return StreamReport(
        symbol,
        pulse,
        delays[0],
        multiple,
        dict(zip(input_names, facts.input_axes, strict=True)),
        dict(zip(output_names, facts.output_axes, strict=True)),
        dict(zip(output_names, delays, strict=True)),
    )


def stream_point(
    session: PulseSession,
    facts: PulseFacts,
    run: Callable[[Sequence[torch.Tensor]], list[torch.Tensor]],
    label: str,
    inputs: tuple[torch.Tensor, ...],
    names: Sequence[str],
    tol: Callable[[Sequence[Any]], float],
) -> StreamPoint:
    arrays = [t.detach().numpy() for t in inputs]
    axes_in = facts.input_axes
    length = arrays[0].shape[axes_in[0]]
    delays = facts.per_output(len(names))
    whole = [t.detach().numpy() for t in run(inputs)]
    need = [w.shape[a] + d for w, a, d in zip(whole, facts.output_axes, delays, strict=True)]
    pieces = push_all(session, arrays, axes_in, facts.output_axes, need)
    chunks = len(pieces)
    streamed = [np.concatenate([p[i] for p in pieces], axis=a) for i, a in enumerate(facts.output_axes)]
    fed = [pad_to(a, ax, chunks * session.pulse) for a, ax in zip(arrays, axes_in, strict=True)]
    want_all = [t.detach().numpy() for t in run(tuple(torch.from_numpy(a) for a in fed))]
    got, want = [], []
    for s, w, a, d, small in zip(streamed, want_all, facts.output_axes, delays, whole, strict=True):
        count = min(s.shape[a] - d, w.shape[a])
        if count < small.shape[a]:
            raise CheckError(
                f"{label}: the stream gave {s.shape[a] - d} steps after its delay, PyTorch {small.shape[a]}"
            )
        got.append(np.take(s, np.arange(d, d + count), axis=a))
        want.append(np.take(w, np.arange(count), axis=a))
    return StreamPoint(label, length, chunks, compare(list(names), want, got, tol(want)))


def push_all(
    session: PulseSession, arrays: list[np.ndarray], axes_in: list[int], axes_out: list[int], need: list[int]
) -> list[list[np.ndarray]]:
    """Push the inputs chunk by chunk, then zero chunks until every output has ``need`` steps."""
    pulse = session.pulse
    length = arrays[0].shape[axes_in[0]]
    pieces: list[list[np.ndarray]] = []
    have = [0] * len(need)
    limit = math.ceil(length / pulse) + max(need) + 8  # an output can only lag by so much
    k = 0
    while k * pulse < length or any(h < n for h, n in zip(have, need, strict=True)):
        if k > limit:
            raise CheckError(f"the stream gave only {have} output steps after {k} chunks, {need} needed")
        chunk = [chunk_of(a, ax, k * pulse, pulse) for a, ax in zip(arrays, axes_in, strict=True)]
        outs = session.push(chunk)
        pieces.append(outs)
        have = [h + o.shape[ax] for h, o, ax in zip(have, outs, axes_out, strict=True)]
        k += 1
    return pieces


def chunk_of(array: np.ndarray, axis: int, start: int, pulse: int) -> np.ndarray:
    """``array[start:start + pulse]`` along ``axis``, zero-padded past its end."""
    part = np.take(array, np.arange(start, min(start + pulse, array.shape[axis])), axis=axis)
    return pad_to(part, axis, pulse)


def pad_to(array: np.ndarray, axis: int, size: int) -> np.ndarray:
    missing = size - array.shape[axis]
    if missing <= 0:
        return np.ascontiguousarray(array)
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, missing)
    return np.pad(array, widths)


_MODULE = re.compile(r"module '([^']*)'")


def with_source(exc: StreamingError, model: Any) -> StreamingError:
    """``exc`` naming the source of the module it names (the model's own ``forward`` when the op
    is at the top level): ``…, in nets.py:12 (Encoder.forward)``."""
    import inspect

    found = _MODULE.search(str(exc))
    try:
        sub = model.get_submodule(found.group(1)) if found else model
        forward = type(sub).forward
        where = f"{inspect.getsourcefile(forward)}:{inspect.getsourcelines(forward)[1]}"
    except (AttributeError, OSError, TypeError):
        return exc
    return type(exc)(f"{exc} [{type(sub).__name__}.forward at {where}]")

"""``torchlower check ARCHIVE --stream T=32 --model ...``: an archive's pulsed model verified
against a PyTorch model (``pipeline/stream_check.py`` does the streaming and comparing)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from torchlower.artifact import io
from torchlower.artifact.stream import axes_of
from torchlower.errors import StreamingError
from torchlower.nnef import reader
from torchlower.nnef.graph_model import Graph
from torchlower.nnef.pulse import hazards, pulse_floor
from torchlower.pipeline import stream_check


def _at_least(symbol: str) -> re.Pattern[str]:
    return re.compile(rf"tract_assert\s+{re.escape(symbol)}\s*>=\s*(\d+)\Z")


def verify_stream(
    path: Path,
    graph: Graph,
    model: Any,
    pulses: Any,
    inputs: Mapping[str, Any] | Sequence[Any] | None = None,
    tolerance: float | None = None,
    seed: int = 0,
) -> stream_check.StreamReport:
    """``torchlower check ARCHIVE --stream T=32 --model ...``: the archive pulsed at that pulse,
    streamed on ``inputs`` (or random ones at the export's sizes) and on random inputs of two
    other lengths, compared with ``model`` on the streamed signal; ``CheckError`` on a mismatch."""
    import torch

    from torchlower.core import model_io
    from torchlower.core import tolerance as tolerances

    symbol, pulse = stream_check.stream_argument(
        pulses, axes_of(graph), True, [d.name for d in graph.inputs], archive=True
    ) or ("", 0)
    found = hazards(graph, symbol)
    if found:
        raise StreamingError(f"{path} cannot stream over {symbol}: {found[0]}")
    with reader.extracted(path) as folder:
        art = io.load(folder)
        first = io.inputs_for(art, inputs, None, seed)
        decl = graph.inputs[0]
        axis = next(i for i, d in enumerate(decl.shape) if d == symbol)
        base = first[0].shape[axis]
        points = [("given inputs" if inputs is not None else f"random ({symbol}={base}, seed {seed})", first)]
        lowest = max(
            [1, *(int(m.group(1)) for e in graph.extensions if (m := _at_least(symbol).match(e.strip())))]
        )
        for k, n in enumerate((base + pulse + 3, max(base // 2 + 1, lowest)), start=1):
            sizes = {**art.graph.example_sizes, symbol: n}
            points.append(
                (f"{symbol}={n} (random, seed {seed + k})", io.inputs_for(art, None, sizes, seed + k))
            )

        def run(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
            with torch.no_grad():
                return model_io.flatten_outputs(model(*tensors))

        def tol(want: Sequence[Any]) -> float:
            return tolerance if tolerance is not None else tolerances.default(want)

        recorded = graph.streaming if graph.streaming.get("symbol") == symbol else {}
        tensors = [
            (label, tuple(torch.from_numpy(np.ascontiguousarray(a)) for a in arrays))
            for label, arrays in points
        ]
        return stream_check.check_stream(
            folder, run, tensors, [d.name for d in graph.inputs], list(graph.outputs), symbol, pulse, tol,
            path, recorded.get("multiple"), pulse_floor(graph), graph,
        )  # fmt: skip

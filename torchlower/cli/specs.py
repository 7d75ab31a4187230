"""Parsing the small languages of the command line: input specs, dynamic axes, npz files."""

from __future__ import annotations

import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from torchlower.cli.failures import usage_error
from torchlower.core import dtypes

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class InputSpec:
    """``x:1x3x224x224:f32`` — a named example input to draw at random."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # torchlower's spelling (torchlower.core.dtypes): float32, int64, …


def input_spec(text: str) -> InputSpec:
    """Parse ``NAME:DIMS[:DTYPE]`` (dims joined by ``x``; ``NAME:scalar`` for rank 0)."""
    parts = text.split(":")
    example = "write NAME:DIMS[:DTYPE], e.g. x:1x3x224x224 or ids:1x16:i64"
    if len(parts) not in (2, 3) or not _NAME.match(parts[0]):
        raise usage_error(f"--input {text!r}: expected NAME:DIMS[:DTYPE]", f"{example}.")
    name, dims = parts[0], parts[1]
    dtype = dtypes.canonical(parts[2]) if len(parts) == 3 else "float32"
    if dtype is None:
        raise usage_error(f"--input {text!r}: unknown dtype {parts[2]!r}", f"use one of {dtypes.accepted()}.")
    if dims == "scalar":
        return InputSpec(name, (), dtype)
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        raise usage_error(
            f"--input {text!r}: dimensions {dims!r} are not integers joined by 'x'", f"{example}."
        ) from None
    if any(d < 0 for d in shape):
        raise usage_error(f"--input {text!r}: dimensions must be >= 0")
    return InputSpec(name, shape, dtype)


def example_tensors(specs: list[InputSpec], seed: int) -> list[Any]:
    """Random tensors for ``specs``: floats standard normal, integers 0 or 1, bools random."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    out = []
    for s in specs:
        dtype = getattr(torch, s.dtype)
        if dtype.is_floating_point:
            out.append(torch.randn(s.shape, generator=gen).to(dtype))
        else:
            out.append(torch.randint(0, 2, s.shape, generator=gen).to(dtype))
    return out


_FORM = r"(?:\d+\*)?[A-Za-z_]\w*(?:\*\d+)?(?:[+-]\d+)?"  # B, or a multiple: 32*h, 32*h+1
_DYNAMIC = re.compile(rf"([A-Za-z_]\w*):(-?\d+)=({_FORM})(?:\[(\d*)\.\.(\d*)\])?")


def dynamic_axes(
    items: list[str], names: list[str]
) -> dict[str, dict[int, str | tuple[str, int, int | None]]]:
    """``x:0=B`` → ``{"x": {0: "B"}}`` (the torch.onnx convention ``export`` takes);
    ``x:1=S[2..128]`` → ``{"x": {1: ("S", 2, 128)}}`` (bounds; ``S[2..]`` has no max, ``S[..64]``
    min 1), the spelling ``dynamic_axes`` takes for ``Dim("S", min=2, max=128)``; ``x:2=32*h``
    → ``{"x": {2: "32*h"}}`` (sizes that are multiples of 32; bounds then bound ``h``)."""
    axes: dict[str, dict[int, str | tuple[str, int, int | None]]] = {}
    example = (
        "e.g. --dynamic x:0=B, with bounds --dynamic x:1=S[2..128] (min..max, either may be left out),"
        " or multiples --dynamic x:2=32*h."
    )
    for text in items:
        m = _DYNAMIC.fullmatch(text)
        if m is None:
            raise usage_error(
                f"--dynamic {text!r}: expected INPUT:AXIS=SYMBOL or INPUT:AXIS=SYMBOL[MIN..MAX]", example
            )
        name, axis, symbol, lo, hi = m.group(1), int(m.group(2)), m.group(3), m.group(4), m.group(5)
        if names and name not in names:
            raise usage_error(f"--dynamic {text!r}: no input named {name!r} (inputs: {', '.join(names)})")
        if lo is None:
            axes.setdefault(name, {})[axis] = symbol
            continue
        low, high = int(lo) if lo else 1, int(hi) if hi else None
        if low < 1 or (high is not None and high < low):
            raise usage_error(f"--dynamic {text!r}: bounds must satisfy 1 <= MIN <= MAX", example)
        axes.setdefault(name, {})[axis] = (symbol, low, high)
    return axes


def symbol_sizes(items: list[str]) -> dict[str, int]:
    """``B=4`` → ``{"B": 4}``: sizes of symbolic dimensions for generated inputs."""
    sizes = {}
    for text in items:
        m = re.fullmatch(r"([A-Za-z_]\w*)=(\d+)", text)
        if m is None:
            raise usage_error(f"--symbol {text!r}: expected SYMBOL=SIZE", "e.g. --symbol B=4.")
        sizes[m.group(1)] = int(m.group(2))
    return sizes


def read_npz(path: str, option: str) -> list[np.ndarray] | dict[str, np.ndarray]:
    """Arrays of an ``.npz``: a list if saved positionally (arr_0, arr_1…), else by name."""
    file = Path(path)
    if not file.is_file():
        raise usage_error(f"{option} {path!r}: file does not exist")
    try:
        with np.load(file, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise usage_error(
            f"{option} {path!r}: not a readable .npz ({exc})",
            "write it with numpy.savez(path, name=array, ...) — object arrays are refused.",
        ) from exc
    positional = [f"arr_{i}" for i in range(len(arrays))]
    if sorted(arrays) == sorted(positional):
        return [arrays[k] for k in positional]
    return arrays

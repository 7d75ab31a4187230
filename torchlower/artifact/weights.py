"""The ``.dat`` tensors of an artifact, decoded and checked against the graph's variables."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from torchlower.core import progress
from torchlower.errors import ArtifactError
from torchlower.nnef import dat
from torchlower.nnef.parse import Graph

KIND_OF_VARIABLE = {"scalar": "f", "integer": "iu", "logical": "b"}


def decode_weights(
    target: Path,
    graph: Graph,
    members: dict[str, bytes],
    weights: dict[str, np.ndarray],
    formats: dict[str, str],
    stored: dict[str, int],
) -> None:
    """Decode the ``.dat`` of every variable (popped from ``members``), checked against the graph."""
    for var in graph.variables:
        member = f"{var.label}.dat"
        if var.label in weights:
            continue
        blob = members.pop(member, None)
        if blob is None:
            raise ArtifactError(
                f"{target}: graph.nnef line {var.line}: variable {var.label!r} has no {member!r}"
                " in the artifact"
            )
        array = dat.decode(blob, member)
        if tuple(array.shape) != var.shape:
            raise ArtifactError(
                f"{target}: {member}: shape {list(array.shape)} differs from graph.nnef line {var.line}"
                f" shape {list(var.shape)}"
            )
        quantized = blob[48] in (dat.QUINT, dat.QINT)  # real values as integer codes (graph.quant)
        if array.dtype.kind not in KIND_OF_VARIABLE[var.kind] and not (quantized and var.kind == "scalar"):
            raise ArtifactError(f"{target}: {member}: dtype {array.dtype} cannot back a variable<{var.kind}>")
        weights[var.label] = array
        formats[var.label] = dat_format(blob)
        stored[var.label] = len(blob) - dat.HEADER_SIZE
        progress.advance()


def dat_format(blob: bytes) -> str:
    """Storage format of a ``.dat`` from its header: the dtype's name (``float32``; ``qint8`` for
    linearly quantized codes) or a vendor block format (``q4_0``)."""
    bits, code, vendor = struct.unpack_from("<IHH", blob, 44)
    if blob[48:52] == b"\x40\x30\x52\x54":
        return "q4_0"
    if vendor != 0:
        return f"vendor_{vendor:04x}_{code}"
    names = {dat.FLOAT: "float", dat.INT: "int", dat.UINT: "uint", dat.QUINT: "quint", dat.QINT: "qint"}
    return "bool" if code == dat.BOOL else f"{names.get(code, f'type{code}_')}{bits}"  # float32, qint8…

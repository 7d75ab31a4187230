"""What an LLM archive carries besides the graph: provenance properties, tokenizer, I/O samples.

All deterministic: properties are sorted and hold no date, host or user; the ``.npz`` samples
are zip files with fixed entry times, written in a fixed order.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Mapping, Sequence

import numpy as np

_EPOCH = (1980, 1, 1, 0, 0, 0)  # the earliest time a zip entry can hold


def properties_fragment(properties: Mapping[str, str | int | float]) -> str:
    """``tract_core_properties``: the fragment tract reads model properties from (nnef/src/deser.rs)."""
    items = []
    for key in sorted(properties):
        value = properties[key]
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            value = str(value)
        literal = json.dumps(value) if isinstance(value, str) else repr(value)
        items.append(f"({json.dumps(key)}, {literal})")
    return (
        "fragment tract_core_properties(\n) -> (properties: (string, tensor<scalar>)[])\n{\n"
        f"  properties = [{', '.join(items)}];\n}}\n"
    )


def with_header(graph: str, extensions: Sequence[str], fragment: str) -> str:
    """``graph`` with ``extension`` lines added after its own and ``fragment`` before the graph."""
    lines = graph.splitlines(keepends=True)
    last_ext = max(i for i, line in enumerate(lines) if line.startswith("extension "))
    graph_at = next(i for i, line in enumerate(lines) if line.startswith("graph "))
    added = [f"extension {e};\n" for e in extensions]
    return "".join([*lines[: last_ext + 1], *added, *lines[last_ext + 1 : graph_at], fragment, "\n",
                    *lines[graph_at:]])  # fmt: skip


def npz(arrays: Mapping[str, np.ndarray]) -> bytes:
    """``numpy.savez`` content with fixed entry times (``np.load`` reads it)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, array in arrays.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            payload = io.BytesIO()
            np.lib.format.write_array(payload, np.ascontiguousarray(array), allow_pickle=False)
            zf.writestr(info, payload.getvalue())
    return buffer.getvalue()

"""Stage 6, write: the archive goes to a staging name beside the target while it is checked and
is renamed onto the target after (a failed check leaves no file); unchecked, ``archive.write``
is atomic by itself."""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from torchlower.core.staging import staged
from torchlower.nnef import archive
from torchlower.nnef.quant import BlockQuantized


@contextlib.contextmanager
def staging(target: Path, check: bool) -> Iterator[Path]:
    """Where to write: a staged name when a check follows, the target itself otherwise."""
    with staged(target) if check else contextlib.nullcontext(target) as path:
        yield path


def weight_bytes(weights: Mapping[str, Any]) -> int:
    return sum(archive.weight_bytes(t) for t in weights.values())


def bytes_by_format(weights: Mapping[str, Any]) -> dict[str, int]:
    """Weight bytes per storage format (``f32``, ``f16``, ``q4_0``…)."""
    out: Counter[str] = Counter()
    for w in weights.values():
        key = w.format.name if isinstance(w, BlockQuantized) else str(w.dtype).removeprefix("torch.")
        out[key] += archive.weight_bytes(w)
    return dict(sorted(out.items()))

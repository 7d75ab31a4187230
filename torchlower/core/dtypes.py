"""One dtype vocabulary for everything torchlower prints and accepts.

Three spellings meet in this project: tract's datum types in ``graph.nnef`` (``f32``, ``i64``),
NNEF's generic kinds (``scalar``, ``integer``, ``logical``) and numpy / torch names
(``float32``, ``int64``, ``long``). Users type any of them; torchlower always *prints* the
numpy name (``float32``), which is also what ``np.dtype`` and ``torch.<name>`` accept.
"""

from __future__ import annotations

from typing import Any

import numpy as np

CANONICAL = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
]
_ALIASES = {
    "f16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "f32": "float32",
    "float": "float32",
    "scalar": "float32",  # NNEF's generic real type; tract reads it as f32
    "f64": "float64",
    "double": "float64",
    "i8": "int8",
    "i16": "int16",
    "short": "int16",
    "i32": "int32",
    "int": "int32",
    "i64": "int64",
    "long": "int64",
    "integer": "int64",  # NNEF's generic integer type
    "u8": "uint8",
    "u16": "uint16",
    "u32": "uint32",
    "u64": "uint64",
    "logical": "bool",  # NNEF's generic boolean type
    "b": "bool",
    "tdim": "int64",  # tract's symbolic-dimension integers surface as i64
}


def canonical(text: str) -> str | None:
    """The printed spelling of a dtype written any accepted way, None if unknown."""
    key = text.strip().lower().removeprefix("torch.").removeprefix("np.").removeprefix("numpy.")
    if key in CANONICAL:
        return key
    return _ALIASES.get(key)


def name(dtype: Any) -> str:
    """The printed spelling of a tract datum string, numpy dtype or torch dtype."""
    text = dtype.name if isinstance(dtype, np.dtype) else str(dtype)
    return canonical(text) or text


def numpy_of(dtype: Any) -> np.dtype | None:
    """The numpy dtype behind a spelling (None for bfloat16 or unknown names)."""
    spelled = canonical(str(dtype)) if not isinstance(dtype, np.dtype) else dtype.name
    if spelled is None or spelled == "bfloat16":
        return None
    return np.dtype(spelled)


def accepted() -> str:
    """The spellings a user may type, for error messages."""
    return ", ".join(CANONICAL) + " (and f32, i64, long, half, … as aliases)"

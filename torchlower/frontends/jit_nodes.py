"""What the jit front end reads off a TorchScript node: its tensor type and shape, its arguments
with ScalarType codes as dtypes, and the model's source line and module scope for messages."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from torchlower.frontends import provenance
from torchlower.frontends.session import Meta

_SCALAR_TYPES = {
    "Float": torch.float32, "Double": torch.float64, "Half": torch.float16,
    "BFloat16": torch.bfloat16, "Long": torch.int64, "Int": torch.int32, "Short": torch.int16,
    "Char": torch.int8, "Byte": torch.uint8, "Bool": torch.bool, "UInt16": torch.uint16,
    "UInt32": torch.uint32, "UInt64": torch.uint64, "ComplexFloat": torch.complex64,
}  # fmt: skip
# ScalarType enum values, as traced graphs store dtype arguments
DTYPE_OF_CODE = {
    0: torch.uint8, 1: torch.int8, 2: torch.int16, 3: torch.int32, 4: torch.int64,
    5: torch.float16, 6: torch.float32, 7: torch.float64, 8: torch.complex32, 9: torch.complex64,
    10: torch.complex128, 11: torch.bool, 12: torch.qint8, 13: torch.quint8, 14: torch.qint32,
    15: torch.bfloat16, 23: torch.float8_e5m2, 24: torch.float8_e4m3fn, 27: torch.uint16,
    28: torch.uint32, 29: torch.uint64,
}  # fmt: skip


def is_tensor(value: torch._C.Value) -> bool:
    return isinstance(value.type(), torch._C.TensorType)


def meta(output: torch._C.Value) -> Meta:
    ty = output.type()
    if not isinstance(ty, torch._C.TensorType):
        return (None, None)
    sizes = ty.sizes()
    return _SCALAR_TYPES.get(ty.scalarType() or ""), tuple(sizes) if sizes is not None else None


_ARG_TYPE = re.compile(r"^\s*([A-Za-z]+)")


def normalize_args(schema: str, args: list[Any]) -> list[Any]:
    """Turn ScalarType ints into torch dtypes, using the node's schema."""
    if not schema or "ScalarType" not in schema:
        return args
    params = schema.split("(", 1)[1].rsplit(") ->", 1)[0]
    types = [m.group(1) if (m := _ARG_TYPE.match(p)) else "" for p in _split_params(params)]
    return [
        DTYPE_OF_CODE.get(a, a) if t == "ScalarType" and isinstance(a, int) else a
        for t, a in zip(types, args, strict=False)
    ]


def _split_params(params: str) -> list[str]:
    parts, depth, current = [], 0, ""
    for ch in params:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p for p in (p.strip() for p in parts) if p and p != "*"]


_JIT_FRAME = re.compile(r"^(.*)\((\d+)\): (\S+)$", re.MULTILINE)
_SCRIPT_FRAME = re.compile(r'File "([^"]+)", line (\d+)')  # a scripted graph's source range


def source_location(node: torch._C.Node, scope: str) -> str | None:
    """``block.1 (model.py:12 in forward)``: the innermost frame of the trace's recorded stack that
    is the user's code (not torch's or torchlower's), so errors name the model's line."""
    text = node.sourceRange()
    frames = _JIT_FRAME.findall(text) or [(p, n, "") for p, n in _SCRIPT_FRAME.findall(text)]
    found = provenance.model_frame(frames)  # innermost first; never the caller of the export
    if found is not None:
        path, line, fn = found
        where = f"{Path(path).name}:{line}" + (f" in {fn}" if fn else "")
        return f"{scope} ({where})" if scope else where
    return scope or None


def scope_of(node: torch._C.Node) -> str:
    """``__module.features/__module.features.0`` → ``features.0``."""
    scope = node.scopeName().split("/")[-1]
    return scope.removeprefix("__module.").removeprefix("__module")

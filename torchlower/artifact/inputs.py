"""Graph inputs for ``check`` and ``run``: the user's arrays checked against the declaration, or
random ones drawn from the declared shapes (symbols at the export's recorded sizes)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from torchlower.errors import ArtifactError, InvalidArgumentError
from torchlower.nnef.parse import Expr, Input

_SUM_BOUND = re.compile(r"tract_assert\s+([A-Za-z_]\w*(?:\s*\+\s*[A-Za-z_]\w*)+)\s*(<=|>=)\s*(-?\d+)\s*$")
SYMBOL_SIZE = 2  # size given to each symbolic dim when inputs are generated
NUMPY_OF_DATUM = {
    "f16": np.float16,
    "f32": np.float32,
    "f64": np.float64,
    "scalar": np.float32,
    "i8": np.int8,
    "i16": np.int16,
    "i32": np.int32,
    "i64": np.int64,
    "integer": np.int64,
    "u8": np.uint8,
    "u16": np.uint16,
    "u32": np.uint32,
    "u64": np.uint64,
    "bool": np.bool_,
    "logical": np.bool_,
}


def inputs_for(
    art: Any, given: Sequence[Any] | Mapping[str, Any] | None, sizes: Mapping[str, int] | None, seed: int
) -> list[np.ndarray]:
    decls = art.graph.inputs
    if given is None:
        rng = np.random.default_rng(seed)
        known = {**art.graph.example_sizes, **(sizes or {})}  # the export's sizes unless told
        env = {s: int(known.get(s, SYMBOL_SIZE)) for s in art.graph.symbols}
        return [_random(rng, d, [_dim_value(x, env, d) for x in d.shape]) for d in decls]
    found = arrays(given, [d.name for d in decls], "inputs")
    for decl, array in zip(decls, found, strict=True):
        want = NUMPY_OF_DATUM.get(decl.dtype)
        if want is not None and array.dtype != np.dtype(want):
            raise InvalidArgumentError(
                f"input {decl.name!r} is declared {decl.dtype} but got {array.dtype}; convert it with"
                f" .astype(np.{np.dtype(want).name})"
            )
        if len(array.shape) != len(decl.shape) or any(
            isinstance(d, int) and d != s for d, s in zip(decl.shape, array.shape, strict=True)
        ):
            raise InvalidArgumentError(
                f"input {decl.name!r} has shape {list(array.shape)}, the graph declares"
                f" {[dim_text(d) for d in decl.shape]}"
            )
    return found


def _random(rng: np.random.Generator, decl: Input, shape: list[int]) -> np.ndarray:
    dtype = np.dtype(NUMPY_OF_DATUM.get(decl.dtype, np.float32))
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    return rng.integers(0, 2, shape).astype(dtype)


def _dim_value(dim: Any, env: Mapping[str, int], decl: Input) -> int:
    if isinstance(dim, bool) or not isinstance(dim, (int, str, Expr)):
        raise ArtifactError(f"input {decl.name!r}: dimension {dim!r} is not an integer or symbol")
    if isinstance(dim, int):
        return dim
    if isinstance(dim, str):
        if dim not in env:
            raise ArtifactError(
                f"input {decl.name!r}: symbol {dim!r} is not declared (extension tract_symbol)"
            )
        return env[dim]
    values = [_dim_value(a.name if hasattr(a, "name") else a, env, decl) for a in dim.args]
    if dim.op in ("min", "max"):
        return min(values) if dim.op == "min" else max(values)
    if len(values) == 1:
        return -values[0] if dim.op == "-" else values[0]
    a, b = values
    ops = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0, "^": a**b if b < 64 else 0}
    return ops[dim.op]


def dim_text(dim: Any) -> int | str:
    return dim if isinstance(dim, int) else str(dim)


def arrays(values: Sequence[Any] | Mapping[str, Any], names: Sequence[str], what: str) -> list[np.ndarray]:
    if isinstance(values, Mapping):
        missing = [n for n in names if n not in values]
        extra = [k for k in values if k not in names]
        if missing or extra:
            raise InvalidArgumentError(
                f"{what} keys must be {list(names)}; missing {missing}, unexpected {extra}"
            )
        values = [values[n] for n in names]
    if isinstance(values, np.ndarray) or hasattr(values, "numpy"):
        values = [values]
    items = [_to_numpy(v) for v in values]
    if len(items) != len(names):
        raise InvalidArgumentError(f"{len(items)} {what} for {len(names)} graph tensors {list(names)}")
    return items


def _to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # torch.Tensor
        return value.detach().cpu().numpy().copy()
    return np.asarray(value)


def check_sum_bounds(env: Mapping[str, int], extensions: Sequence[str], where: object) -> None:
    """The archive's ``tract_assert P + S <= 128`` bounds (a sum of symbols), which tract does not
    check before it runs (past a position table it aborts); ``InvalidArgumentError`` naming them."""
    for ext in extensions:
        m = _SUM_BOUND.match(ext.strip())
        if m is None:
            continue
        names = [n.strip() for n in m.group(1).split("+")]
        if not all(n in env for n in names):
            continue
        value, op, bound = sum(env[n] for n in names), m.group(2), int(m.group(3))
        if (value < bound) if op == ">=" else (value > bound):
            sizes = ", ".join(f"{n} = {env[n]}" for n in names)
            raise InvalidArgumentError(
                f"{where}: {' + '.join(names)} = {value} ({sizes}) is outside the archive's bound"
                f" {m.group(1)} {op} {bound}; an LLM archive holds at most {bound} positions"
            )

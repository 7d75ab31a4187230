"""Running a loaded artifact: inputs checked against the declaration, outputs by name.

``torchlower.load(path).run(inputs)`` lands here. Inputs come by name (a mapping) or by
position (a sequence, or one array for a one-input graph); each is checked against the
``external`` declaration of ``graph.nnef`` before tract sees it: dtype exactly, rank, fixed
sizes, every symbol (``B``) bound to one size across all inputs, sizes declared as multiples
(``32 * h``: tract itself would round 33 down to h = 1) and the ``tract_assert`` bounds. A
violation is an
``InvalidArgumentError`` naming the input, the axis and what the graph declares, so a user
learns about a wrong batch size from us, not from a tract shape error deep in the graph.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from torchlower.core import dtypes
from torchlower.core.dynamic_forms import Form
from torchlower.errors import InvalidArgumentError
from torchlower.nnef.graph_model import Expr, Ident, Input, evaluate

Inputs = Mapping[str, Any] | Sequence[Any] | np.ndarray


def as_list(given: Inputs, decls: Sequence[Input]) -> list[np.ndarray]:
    """The inputs in declaration order, as numpy arrays (torch tensors are copied)."""
    names = [d.name for d in decls]
    if isinstance(given, Mapping):
        missing = [n for n in names if n not in given]
        extra = [k for k in given if k not in names]
        if missing or extra:
            raise InvalidArgumentError(f"inputs must be named {names}; missing {missing}, unexpected {extra}")
        values = [given[n] for n in names]
    elif isinstance(given, np.ndarray) or hasattr(given, "detach"):
        values = [given]
    elif isinstance(given, Sequence) and not isinstance(given, (str, bytes)):
        values = list(given)
    else:
        raise InvalidArgumentError(
            f"inputs must be a dict name -> array or a list of arrays, got {type(given).__name__}"
        )
    if len(values) != len(names):
        raise InvalidArgumentError(f"{len(values)} inputs given, the graph takes {len(names)}: {names}")
    return [_to_numpy(v, n) for v, n in zip(values, names, strict=True)]


def _to_numpy(value: Any, name: str) -> np.ndarray:
    if hasattr(value, "detach"):  # torch.Tensor
        return value.detach().cpu().numpy()
    array = np.asarray(value)
    if array.dtype == object or array.dtype.kind in "USV":
        raise InvalidArgumentError(f"input {name!r}: {array.dtype} arrays cannot be fed to tract")
    return array


def bind(
    decls: Sequence[Input],
    arrays: Sequence[np.ndarray],
    symbols: Sequence[str],
    extensions: Sequence[str] = (),
) -> dict[str, int]:
    """Check every array against its declaration (and the ``tract_assert`` bounds among
    ``extensions``); returns the size each symbol took."""
    env: dict[str, int] = {}
    where: dict[str, tuple[str, int, int]] = {}  # symbol -> (input, axis, size) it was bound at
    pending: list[tuple[Input, int, Any, int]] = []
    for decl, array in zip(decls, arrays, strict=True):
        want = dtypes.numpy_of(decl.dtype)
        if want is not None and array.dtype != want:
            raise InvalidArgumentError(
                f"input {decl.name!r} is declared {dtypes.name(decl.dtype)} but got"
                f" {dtypes.name(array.dtype)}; convert it with .astype(np.{want.name})"
            )
        if array.ndim != len(decl.shape):
            raise InvalidArgumentError(
                f"input {decl.name!r} has rank {array.ndim} (shape {list(array.shape)}), the graph"
                f" declares rank {len(decl.shape)}: {shape_text(decl.shape)}"
            )
        for axis, (dim, size) in enumerate(zip(decl.shape, array.shape, strict=True)):
            if isinstance(dim, int) and dim != size:
                raise InvalidArgumentError(
                    f"input {decl.name!r} axis {axis} has size {size}, the graph declares {dim}"
                    f" (shape {shape_text(decl.shape)})"
                )
            if isinstance(dim, str):
                if dim in env and env[dim] != size:
                    raise InvalidArgumentError(
                        f"input {decl.name!r} axis {axis} has size {size}, but symbol {dim} is already"
                        f" {env[dim]} from an earlier input (shape {shape_text(decl.shape)})"
                    )
                env[dim] = size
                where.setdefault(dim, (decl.name, axis, size))
            elif isinstance(dim, Expr):
                pending.append((decl, axis, dim, size))
    for decl, axis, dim, size in pending:  # 32 * h: the symbol from the size, if it is a multiple
        _solve(decl, axis, dim, size, env, where)
    for decl, axis, dim, size in pending:  # expressions such as B * 2, once every symbol is bound
        value = evaluate(dim, env)
        if value is not None and value != size:
            raise InvalidArgumentError(
                f"input {decl.name!r} axis {axis} has size {size}, the graph declares {dim} = {value}"
            )
    unknown = [s for s in env if s not in symbols]
    if unknown:
        raise InvalidArgumentError(f"symbol {unknown[0]!r} is not declared with extension tract_symbol")
    _check_bounds(env, where, extensions)
    return env


def _names(dim: Any) -> set[str]:
    if isinstance(dim, (str, Ident)):
        return {str(dim)}
    return {n for a in dim.args for n in _names(a)} if isinstance(dim, Expr) else set()


def _solve(
    decl: Input, axis: int, dim: Expr, size: int, env: dict[str, int], where: dict[str, tuple[str, int, int]]
) -> None:
    """Bind the one unbound symbol of a size ``k * h + c`` from ``size`` (tract would round a
    size that is not of that form down to one that is and compute at the wrong size)."""
    free = sorted(n for n in _names(dim) if n not in env)
    if len(free) != 1:
        return
    (symbol,) = free
    values = [evaluate(dim, {**env, symbol: t}) for t in (0, 1, 2, 7)]
    if any(v is None for v in values):
        return
    c, k = values[0], values[1] - values[0]  # type: ignore[operator]
    if k < 1 or values != [c, k + c, 2 * k + c, 7 * k + c]:
        return
    value, rest = divmod(size - c, k)
    if rest or value < 1:
        why = (
            f"{size} is not {Form(symbol, k, c).rule()}"
            if rest
            else f"{size} is below the smallest size {k + c} ({symbol} >= 1)"
        )
        raise InvalidArgumentError(
            f"input {decl.name!r} axis {axis} has size {size}, the graph declares {dim}: {why}"
            f" (shape {shape_text(decl.shape)})"
        )
    env[symbol] = value
    where.setdefault(symbol, (decl.name, axis, size))


_BOUND = re.compile(r"tract_assert\s+([A-Za-z_]\w*)\s*(>=|<=)\s*(\d+)\Z")


def _check_bounds(
    env: Mapping[str, int], where: Mapping[str, tuple[str, int, int]], extensions: Sequence[str]
) -> None:
    """The archive's ``tract_assert S >= 2`` / ``S <= 128`` bounds, naming the input and axis."""
    for ext in extensions:
        m = _BOUND.match(ext.strip())
        if m is None or m.group(1) not in env:
            continue
        symbol, op, bound = m.group(1), m.group(2), int(m.group(3))
        value = env[symbol]
        if (value < bound) if op == ">=" else (value > bound):
            name, axis, size = where.get(symbol, ("?", -1, value))
            at = f" (size {size})" if size != value else ""
            raise InvalidArgumentError(
                f"input {name!r} axis {axis}: {symbol} = {value}{at} is outside the archive's bound"
                f" {symbol} {op} {bound}"
            )


def shape_text(shape: Sequence[Any]) -> str:
    """``[B, 3, 224]`` the way the graph declares it."""
    return "[" + ", ".join(str(d) for d in shape) + "]"


def outputs_by_name(names: Sequence[str], arrays: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
    if len(names) != len(arrays):
        raise InvalidArgumentError(f"tract produced {len(arrays)} outputs for the {len(names)} declared")
    return dict(zip(names, arrays, strict=True))


def statistics(array: np.ndarray) -> dict[str, Any]:
    """min / max / mean / finite count of an output, for ``torchlower run``'s summary."""
    a = np.asarray(array)
    out: dict[str, Any] = {"shape": list(a.shape), "dtype": dtypes.name(a.dtype)}
    if a.size == 0 or a.dtype.kind not in "fiub":
        return out
    values = a.astype(np.float64)
    finite = np.isfinite(values)
    out["finite"] = int(finite.sum())
    if finite.any():
        good = values[finite]
        out.update(min=float(good.min()), max=float(good.max()), mean=float(good.mean()))
    return out


def session_for(path: Path, threads: int | None, isolated: bool) -> Any:
    """A tract session of ``path``: its plans (generic, or optimized per size) load on first use
    from the checked bytes of the archive (``nnef.session.Session``)."""
    from torchlower.nnef.session import Session

    return Session(path, threads, isolated)


def plan_stage(sizes: Mapping[str, int] | None) -> str:
    """The progress line of a plan's first load."""
    at = ", ".join(f"{k}={v}" for k, v in sorted((sizes or {}).items()))
    return "tract load+optimize" + (f" at {at}" if at else "")


# ---- lattice folders ----------------------------------------------------------------------
_MLIR_ARG = re.compile(r"%(\w+):\s*tensor<([^>]*)>")


class LatticeArtifact:
    """A lattice folder (``graph.mlir`` + ``weights.safetensors``) that runs in the reference
    executor: ``run`` takes the ABI inputs (coords / features / active rows of a sparse input
    are three arrays) and returns outputs by name; a sparse output ``y`` becomes
    ``y.coords`` and ``y.features`` (rows in batch, x, y, z order)."""

    def __init__(self, path: Path) -> None:
        from torchlower.lattice import io

        self.path = Path(path)
        self.folder = io.load(self.path)  # validated: exactly graph.mlir + weights.safetensors
        self.graph = self.folder.artifact  # lattice.executor.Artifact
        self.input_names = list(self.graph.input_names)
        self.output_names = list(self.graph.output_names)
        self.declared = _mlir_inputs((self.path / "graph.mlir").read_text(encoding="utf-8"))

    def run(self, inputs: Inputs, *, threads: int | None = None) -> dict[str, np.ndarray]:
        import torch

        from torchlower.lattice.executor import execute
        from torchlower.lattice.sparse import SparseTensor

        decls = [Input(n, *self.declared.get(n, ((), "")), 0) for n in self.input_names]
        arrays = as_list(inputs, decls)
        typed = [(d, a) for d, a in zip(decls, arrays, strict=True) if d.dtype]
        symbols = [dim for d, _ in typed for dim in d.shape if isinstance(dim, str)]
        bind([d for d, _ in typed], [a for _, a in typed], symbols)
        if threads is not None:
            torch.set_num_threads(threads)
        with torch.no_grad():
            results = execute(self.graph, [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays])
        out: dict[str, np.ndarray] = {}
        for name, value in zip(self.output_names, results, strict=True):
            if isinstance(value, SparseTensor):
                out[f"{name}.coords"] = value.coords.numpy()
                out[f"{name}.features"] = value.feats.detach().numpy()
            else:
                out[name] = value.detach().numpy()
        return out

    def close(self) -> None:
        """Nothing to stop (the reference executor runs in this process)."""

    def __enter__(self) -> LatticeArtifact:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _mlir_inputs(text: str) -> dict[str, tuple[tuple[Any, ...], str]]:
    """Declared shape (``?`` → a symbol of its own) and dtype of each ``@forward`` argument."""
    start = text.find("func.func @forward(")
    end = text.find(")", start)
    found: dict[str, tuple[tuple[Any, ...], str]] = {}
    if start < 0 or end < 0:
        return found
    for name, body in _MLIR_ARG.findall(text[start:end]):
        *dims, element = body.split("x")
        shape = tuple(f"{name}_{i}" if d == "?" else int(d) for i, d in enumerate(dims))
        found[name] = (shape, element)
    return found

"""Reading artifacts back: ``load``, ``inspect`` and ``check`` (what the CLI calls).

Artifacts are untrusted: ``load`` validates the container (``nnef/reader.py``), the graph text
(``nnef/parse.py``) and every tensor (``nnef/dat.py``) and raises ``ArtifactError`` naming the
member, line or field. Only numpy is needed, except ``check(model=...)`` which runs torch.

Lattice folders (``graph.mlir`` + ``weights.safetensors``) are handed to
``torchlower.lattice.io`` (functions ``load``, ``inspect``, ``check`` with the same signatures;
``check`` runs the lattice reference executor instead of tract).
"""

from __future__ import annotations

import importlib
import logging
import os
import struct
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from torchlower import tolerance as tolerances
from torchlower.errors import ArtifactError, CheckError, InvalidArgumentError
from torchlower.nnef import dat, reader
from torchlower.nnef.parse import Expr, Graph, Input, parse

log = logging.getLogger("torchlower")

SYMBOL_SIZE = 2  # size given to each symbolic dim when inputs are generated
_KIND_OF_VARIABLE = {"scalar": "f", "integer": "iu", "logical": "b"}
_NUMPY_OF_DATUM = {
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


@dataclass
class Artifact:
    """A checked NNEF artifact: its graph, its weights (by label) and what else it holds."""

    path: Path
    kind: str  # dir | tar | tgz
    graph: Graph
    weights: dict[str, np.ndarray]
    formats: dict[str, str]  # label -> "f32", "i64", ... or a vendor format ("q4_0")
    stored_bytes: dict[str, int]  # label -> bytes of tensor data in the file
    quant: str | None = None  # graph.quant text, if any
    unused: list[str] = field(default_factory=list)  # .dat members no variable refers to

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.graph.inputs]

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.outputs)


def load(path: str | os.PathLike[str], limits: reader.Limits = reader.DEFAULT_LIMITS) -> Any:
    """Read and validate the artifact at ``path``; weights come back as numpy arrays."""
    target = Path(path)
    if _is_lattice(target):
        return _lattice().load(target)
    members = reader.read_members(target, limits)
    if "graph.nnef" not in members:
        raise ArtifactError(f"{target}: no graph.nnef at the top level of the artifact")
    extra = [n for n in members if n not in reader.TEXT_MEMBERS and not n.endswith(".dat")]
    if extra:
        raise ArtifactError(
            f"{target}: unexpected member {extra[0]!r} (an NNEF artifact holds graph.nnef, graph.quant"
            " and .dat tensors)"
        )
    graph = parse(members.pop("graph.nnef"))
    quant = members.pop("graph.quant", None)
    weights: dict[str, np.ndarray] = {}
    formats: dict[str, str] = {}
    stored: dict[str, int] = {}
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
        if array.dtype.kind not in _KIND_OF_VARIABLE[var.kind]:
            raise ArtifactError(f"{target}: {member}: dtype {array.dtype} cannot back a variable<{var.kind}>")
        weights[var.label] = array
        formats[var.label] = dat_format(blob)
        stored[var.label] = len(blob) - dat.HEADER_SIZE
    unused = sorted(members)
    if unused:
        log.warning("%s: %d .dat file(s) no variable refers to, e.g. %s", target, len(unused), unused[0])
    return Artifact(
        target,
        reader.artifact_kind(target),
        graph,
        weights,
        formats,
        stored,
        quant.decode("utf-8", "replace") if quant is not None else None,
        unused,
    )


def dat_format(blob: bytes) -> str:
    """Storage format of a ``.dat`` from its header: numpy-like dtype name or vendor format."""
    bits, code, vendor = struct.unpack_from("<IHH", blob, 44)
    if blob[48:52] == b"\x40\x30\x52\x54":
        return "q4_0"
    if vendor != 0:
        return f"vendor_{vendor:04x}_{code}"
    names = {dat.FLOAT: "f", dat.INT: "i", dat.UINT: "u", dat.BOOL: "bool"}
    return "bool" if code == dat.BOOL else f"{names.get(code, f'type{code}_')}{bits}"


def inspect(path: str | os.PathLike[str], limits: reader.Limits = reader.DEFAULT_LIMITS) -> dict[str, Any]:
    """A JSON-serializable summary: I/O, symbols, op histogram, weight bytes, extensions."""
    target = Path(path)
    if _is_lattice(target):
        return _lattice().inspect(target)
    art = load(target, limits)
    by_dtype: Counter[str] = Counter()
    by_format: Counter[str] = Counter()
    for label, array in art.weights.items():
        by_dtype[str(array.dtype)] += int(array.nbytes)
        by_format[art.formats[label]] += art.stored_bytes[label]
    g = art.graph
    return {
        "path": str(target),
        "format": "nnef",
        "container": art.kind,
        "graph": g.name,
        "inputs": [
            {"name": i.name, "shape": [_dim_text(d) for d in i.shape], "dtype": i.dtype} for i in g.inputs
        ],
        "outputs": [{"name": n} for n in g.outputs],
        "symbols": list(g.symbols),
        "extensions": list(g.extensions),
        "fragments": list(g.fragments),
        "ops": dict(sorted(g.op_histogram().items(), key=lambda kv: (-kv[1], kv[0]))),
        "op_count": len(g.assignments),
        "weights": {
            "count": len(art.weights),
            "bytes": sum(art.stored_bytes.values()),
            "bytes_by_dtype": dict(sorted(by_dtype.items())),
            "bytes_by_format": dict(sorted(by_format.items())),
            "unused_files": list(art.unused),
        },
    }


@dataclass
class CheckResult:
    """Inputs used, outputs tract produced, and per-output errors (empty if nothing to compare)."""

    inputs: list[np.ndarray]
    outputs: list[np.ndarray]
    errors: list[Any]  # torchlower.nnef.tract.OutputError

    @property
    def ok(self) -> bool:
        return all(e.ok for e in self.errors)

    @property
    def max_abs_error(self) -> float:
        return max((e.max_abs for e in self.errors), default=0.0)


def check(
    path: str | os.PathLike[str],
    inputs: Sequence[Any] | Mapping[str, Any] | None = None,
    expected: Sequence[Any] | Mapping[str, Any] | None = None,
    model: Any = None,
    tolerance: float | None = None,
    *,
    symbol_sizes: Mapping[str, int] | None = None,
    seed: int = 0,
) -> CheckResult:
    """Run the artifact in tract and compare with ``expected`` arrays or ``model``'s outputs.

    Without ``inputs``, random ones are drawn from the declared shapes (symbols get
    ``symbol_sizes`` or 2; floats are standard normal, integers 0 or 1, bools random).
    Raises ``CheckError`` when an output differs beyond ``tolerance``.
    """
    from torchlower.nnef.tract import compare, run_in_tract

    target = Path(path)
    if _is_lattice(target):
        return _lattice().check(target, inputs, expected, model, tolerance, seed=seed)
    if expected is not None and model is not None:
        raise InvalidArgumentError("give either expected= or model=, not both")
    with reader.extracted(target) as folder:  # tract reads exactly the bytes we validated
        art = load(folder)
        art.path = target
        ins = _inputs(art, inputs, symbol_sizes, seed)
        outs = run_in_tract(folder, ins)
    names = art.output_names
    if model is not None:
        want = _model_outputs(model, ins)
    elif expected is not None:
        want = _arrays(expected, names, "expected")
    else:
        return CheckResult(ins, outs, [])
    tol = (
        tolerance if tolerance is not None else tolerances.quantized(want, tolerances.quant_steps(art.quant))
    )
    errors = compare(names, want, outs, tol)
    bad = [e for e in errors if not e.ok]
    if bad:
        detail = "; ".join(f"{e.name}: max abs {e.max_abs:.3g} > {e.tolerance:.3g}" for e in bad)
        raise CheckError(f"{target}: tract output differs from the reference — {detail}", errors)
    return CheckResult(ins, outs, errors)


def _inputs(
    art: Artifact, given: Sequence[Any] | Mapping[str, Any] | None, sizes: Mapping[str, int] | None, seed: int
) -> list[np.ndarray]:
    decls = art.graph.inputs
    if given is None:
        rng = np.random.default_rng(seed)
        env = {s: int((sizes or {}).get(s, SYMBOL_SIZE)) for s in art.graph.symbols}
        return [_random(rng, d, [_dim_value(x, env, d) for x in d.shape]) for d in decls]
    arrays = _arrays(given, [d.name for d in decls], "inputs")
    for decl, array in zip(decls, arrays, strict=True):
        want = _NUMPY_OF_DATUM.get(decl.dtype)
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
                f" {[_dim_text(d) for d in decl.shape]}"
            )
    return arrays


def _random(rng: np.random.Generator, decl: Input, shape: list[int]) -> np.ndarray:
    dtype = np.dtype(_NUMPY_OF_DATUM.get(decl.dtype, np.float32))
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
    if len(values) == 1:
        return -values[0] if dim.op == "-" else values[0]
    a, b = values
    ops = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if b else 0, "^": a**b if b < 64 else 0}
    return ops[dim.op]


def _dim_text(dim: Any) -> int | str:
    return dim if isinstance(dim, int) else str(dim)


def _arrays(values: Sequence[Any] | Mapping[str, Any], names: Sequence[str], what: str) -> list[np.ndarray]:
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


def _model_outputs(model: Any, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run the torch model on copies of the inputs; the user's model is not modified."""
    import torch

    from torchlower import api

    if not isinstance(model, torch.nn.Module):
        raise InvalidArgumentError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    module = api._eval_view(model)
    with torch.no_grad():
        out = module(*[torch.from_numpy(np.array(x, copy=True)) for x in inputs])
    return [t.detach().cpu().numpy() for t in api._flatten_outputs(out)]


def _is_lattice(path: Path) -> bool:
    return path.is_dir() and (path / "graph.mlir").exists()


def _lattice() -> Any:
    """The lattice reader, when ``torchlower.lattice.io`` exists (written separately)."""
    try:
        return importlib.import_module("torchlower.lattice.io")
    except ImportError:
        raise ArtifactError(
            "this is a lattice artifact (graph.mlir); reading lattice folders is not available yet"
        ) from None

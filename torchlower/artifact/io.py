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

from torchlower.core import dtypes, progress
from torchlower.core import tolerance as tolerances
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
    _session: Any = field(default=None, repr=False, compare=False)  # nnef.session.Session
    _sized: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)  # sizes -> Session

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self.graph.inputs]

    @property
    def output_names(self) -> list[str]:
        return list(self.graph.outputs)

    def run(
        self, inputs: Any, *, threads: int | None = None, isolated: bool = True, specialize: bool = False
    ) -> dict[str, np.ndarray]:
        """Run in tract: ``{"x": array}`` or ``[arrays]`` in, ``{output name: array}`` out.

        Inputs are checked against the declaration first (dtype, rank, fixed sizes, one size
        per symbol). The first call loads and optimizes the model once (in a child process
        unless ``isolated=False``); later calls reuse it. ``threads`` sets tract's pool size
        for that child (tract's Python API has no thread setting of its own); a different
        ``threads`` than the running child's starts a new one.

        ``specialize=True`` optimizes the graph for these inputs' sizes (as fast as a static
        export; one load+optimize per new size, the last few kept): for a server that sees a
        handful of sizes. Without it one model serves every size.
        """
        from torchlower.artifact import runner

        arrays = runner.as_list(inputs, self.graph.inputs)
        sizes = runner.bind(self.graph.inputs, arrays, self.graph.symbols, self.graph.extensions)
        if specialize and sizes:
            session = runner.sized_session(self._sized, self.path, threads, isolated, sizes)
        else:
            session = self._session
            if session is None or (session.threads, session.isolated) != (threads, isolated):
                if session is not None:
                    session.close()
                with progress.stage("tract load+optimize"):
                    session = self._session = runner.session_for(self.path, threads, isolated)
        with progress.stage("running"):
            return runner.outputs_by_name(self.output_names, session.run(arrays))

    def stream(self, pulses: Mapping[str, int], *, threads: int | None = None, isolated: bool = True) -> Any:
        """The archive pulsed in tract: ``stream({"T": 32})`` → ``artifact.stream.Stream`` with
        ``.delay``, ``.pulse``, ``.push(inputs) -> outputs`` (one chunk each) and ``.reset()``
        (docs/streaming.md). As for ``run``, tract runs in a child process unless ``isolated=False``
        (lowest per-chunk cost, no protection from an abort)."""
        from torchlower.artifact.stream import open_stream

        return open_stream(self.path, self.graph, pulses, threads, isolated)

    def tract_facts(self) -> dict[str, list[str]]:
        """tract's input and output facts (``"B,10,f32"``), loading the model if needed."""
        if self._session is None:
            with progress.stage("tract load+optimize"):
                from torchlower.artifact import runner

                self._session = runner.session_for(self.path, None, True)
        return dict(self._session.facts)

    def close(self) -> None:
        """Stop the tract process started by ``run`` (it also stops when the artifact is freed)."""
        if self._session is not None:
            self._session.close()
            self._session = None
        for session in self._sized.values():
            session.close()
        self._sized.clear()

    def __enter__(self) -> Artifact:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(path: str | os.PathLike[str], limits: reader.Limits = reader.DEFAULT_LIMITS) -> Any:
    """Read and validate the artifact at ``path``; weights come back as numpy arrays."""
    target = Path(path)
    if _is_lattice(target):  # runs in the reference executor (runner.LatticeArtifact)
        from torchlower.artifact.runner import LatticeArtifact

        return LatticeArtifact(target)
    members: dict[str, bytes] = {}
    with progress.stage("reading", unit="bytes"):
        for name, blob in reader.iter_members(target, limits):
            members[name] = blob
            progress.advance(len(blob))
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
    with progress.stage("decoding weights", total=len(graph.variables), unit="tensors"):
        _decode_weights(target, graph, members, weights, formats, stored)
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


def graph_text(path: str | os.PathLike[str], limits: reader.Limits = reader.DEFAULT_LIMITS) -> str:
    """The ``graph.nnef`` text of an artifact, after the container's checks (weights not decoded)."""
    for name, blob in reader.iter_members(Path(path), limits):
        if name == "graph.nnef":
            parse(blob)  # the text must be one we would load
            return blob.decode("utf-8")
    raise ArtifactError(f"{path}: no graph.nnef at the top level of the artifact")


def _decode_weights(
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
        if array.dtype.kind not in _KIND_OF_VARIABLE[var.kind] and not (quantized and var.kind == "scalar"):
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


def inspect(
    path: str | os.PathLike[str], limits: reader.Limits = reader.DEFAULT_LIMITS, *, tract: bool = True
) -> dict[str, Any]:
    """A JSON-serializable summary: I/O, symbols, op histogram, weight bytes, extensions.

    With ``tract`` (the default) every output gets the shape and dtype tract derives when it
    loads the graph (symbolic where the graph is dynamic, e.g. ``["B", 10]``); without it, or
    when tract cannot load the graph, they are ``None``.
    """
    target = Path(path)
    if _is_lattice(target):
        return _lattice().inspect(target)
    art = load(target, limits)
    outputs: list[dict[str, Any]] = [{"name": n, "shape": None, "dtype": None} for n in art.output_names]
    if tract:
        for entry, fact in zip(outputs, _output_facts(target, limits), strict=False):
            entry["shape"], entry["dtype"] = fact
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
            {"name": i.name, "shape": [_dim_text(d) for d in i.shape], "dtype": dtypes.name(i.dtype)}
            for i in g.inputs
        ],
        "outputs": outputs,
        "symbols": list(g.symbols),
        "streaming": dict(g.streaming) or None,  # what export(stream=) verified
        "extensions": list(g.extensions),
        "fragments": list(g.fragments),
        "ops": dict(sorted(g.op_histogram().items(), key=lambda kv: (-kv[1], kv[0]))),
        "op_count": len(g.assignments),
        # ops per module path, from torchlower's ``# module:`` comments (empty for other exporters)
        "modules": dict(Counter(a.scope for a in g.assignments if a.scope)),
        "weights": {
            "count": len(art.weights),
            "bytes": sum(art.stored_bytes.values()),
            "bytes_by_dtype": dict(sorted(by_dtype.items())),
            "bytes_by_format": dict(sorted(by_format.items())),
            "unused_files": list(art.unused),
        },
    }


def _output_facts(target: Path, limits: reader.Limits) -> list[tuple[list[Any], str]]:
    """(shape, dtype) of every output as tract derives them; empty if tract cannot load it."""
    from torchlower.nnef import session

    try:
        with progress.stage("tract load"), reader.extracted(target, limits) as folder:
            known = session.query_facts(folder)
    except CheckError as exc:
        log.info("output shapes unknown: %s", exc)
        return []
    return [session.parse_fact(f) for f in known["outputs"]]


@dataclass
class CheckResult:
    """Inputs used, outputs tract produced, and per-output errors (empty if nothing to compare)."""

    inputs: list[np.ndarray]
    outputs: list[np.ndarray]
    errors: list[Any]  # torchlower.core.comparison.OutputError, every point
    # with model=: every input set checked (the given inputs and random ones like them)
    points: list[Any] = field(default_factory=list)  # torchlower.pipeline.verification.CheckPoint
    original_errors: list[Any] = field(default_factory=list)  # compressed archive vs the original
    comparison: str | None = None  # what the outputs were compared with, in words

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
    ``symbol_sizes``, else the sizes the export recorded (``# example sizes:``), else 2;
    floats are standard normal, integers 0 or 1, bools random).
    With ``model``, the check also runs at random inputs resembling those, and compares the
    way ``export`` does (a compressed archive against the dequantized model, an f16 one with
    the f16 tolerance): ``torchlower/model_check.py``.
    Raises ``CheckError`` when an output differs beyond ``tolerance``.
    """
    from torchlower.core.comparison import compare
    from torchlower.nnef.tract import run_in_tract

    target = Path(path)
    if _is_lattice(target):
        return _lattice().check(target, inputs, expected, model, tolerance, seed=seed)
    if expected is not None and model is not None:
        raise InvalidArgumentError("give either expected= or model=, not both")
    with reader.extracted(target) as folder:  # tract reads exactly the bytes we validated
        art = load(folder)
        art.path = target
        ins = inputs_for(art, inputs, symbol_sizes, seed)
        if model is not None:
            from torchlower.artifact import model_check

            found = model_check.check(folder, target, art, ins, model, tolerance)
            errors = [e for p in found.points for e in p.errors]
            original = [e for p in found.original for e in p.errors]
            return CheckResult(ins, found.outputs, errors, found.points, original, found.comparison)
        outs = run_in_tract(folder, ins)
    names = art.output_names
    if expected is not None:
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
    return CheckResult(ins, outs, errors, comparison="expected outputs")


def inputs_for(
    art: Artifact, given: Sequence[Any] | Mapping[str, Any] | None, sizes: Mapping[str, int] | None, seed: int
) -> list[np.ndarray]:
    decls = art.graph.inputs
    if given is None:
        rng = np.random.default_rng(seed)
        known = {**art.graph.example_sizes, **(sizes or {})}  # the export's sizes unless told
        env = {s: int(known.get(s, SYMBOL_SIZE)) for s in art.graph.symbols}
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
    if dim.op in ("min", "max"):
        return min(values) if dim.op == "min" else max(values)
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

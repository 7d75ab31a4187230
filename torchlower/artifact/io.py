"""Reading artifacts back: ``load``, ``inspect`` and ``check`` (what the CLI calls).

Artifacts are untrusted: ``load`` validates the container (``nnef/reader.py``), the graph text
(``nnef/parse.py``) and every tensor (``nnef/dat.py``) and raises ``ArtifactError`` naming the
member, line or field. Only numpy is needed, except ``check(model=...)`` which runs torch.

Lattice folders (``graph.mlir`` + ``weights.safetensors``) are handed to
``torchlower.lattice.io`` (functions ``load``, ``inspect``, ``check`` with the same signatures;
``check`` runs the lattice reference executor instead of tract).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from torchlower.artifact import bundled
from torchlower.artifact.inputs import arrays, check_sum_bounds, dim_text, inputs_for
from torchlower.artifact.weights import decode_weights
from torchlower.core import dtypes, progress
from torchlower.core import tolerance as tolerances
from torchlower.errors import ArtifactError, CheckError, InvalidArgumentError
from torchlower.nnef import reader
from torchlower.nnef.parse import Graph, parse

log = logging.getLogger("torchlower")


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
    # what torchlower bundled beside the graph (config.json, tokenizer, io/*.npz), name → bytes
    bundled: dict[str, bytes] = field(default_factory=dict, repr=False)
    properties: dict[str, str | int | float] = field(default_factory=dict)  # tract_core_properties
    _session: Any = field(default=None, repr=False, compare=False)  # nnef.session.Session

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

        ``specialize=True`` optimizes the graph for these inputs' sizes first (tract's
        ``SetSymbols``): a dynamic archive then runs as fast as a static export at that size.
        Each new size costs one load + optimize; the plans of the last four sizes stay loaded
        beside the generic one. For a server that sees a handful of sizes, not for a decode
        loop whose length grows every step. Without it one plan serves every size.
        """
        from torchlower.artifact import runner

        arrays = runner.as_list(inputs, self.graph.inputs)
        sizes = runner.bind(self.graph.inputs, arrays, self.graph.symbols, self.graph.extensions)
        check_sum_bounds(sizes, self.graph.extensions, self.path)
        plan = sizes if specialize else None
        session = self._open(threads, isolated)
        if not session.loaded(plan):
            with progress.stage(runner.plan_stage(plan)), named(self.path):
                session.load(plan)
        with progress.stage("running"), named(self.path):
            return runner.outputs_by_name(self.output_names, session.run(arrays, plan))

    def _open(self, threads: int | None, isolated: bool) -> Any:
        """The tract session for ``threads`` / ``isolated`` (another one closes the running one)."""
        from torchlower.artifact import runner

        session = self._session
        if session is None or (session.threads, session.isolated) != (threads, isolated):
            if session is not None:
                session.close()
            session = self._session = runner.session_for(self.path, threads, isolated)
        return session

    def stream(self, pulses: Mapping[str, int], *, threads: int | None = None, isolated: bool = True) -> Any:
        """The archive pulsed in tract: ``stream({"T": 32})`` → ``artifact.stream.Stream`` with
        ``.delay``, ``.pulse``, ``.push(inputs) -> outputs`` (one chunk each) and ``.reset()``
        (docs/streaming.md). As for ``run``, tract runs in a child process unless ``isolated=False``
        (lowest per-chunk cost, no protection from an abort)."""
        from torchlower.artifact.stream import open_stream

        return open_stream(self.path, self.graph, pulses, threads, isolated)

    def tract_facts(self) -> dict[str, list[str]]:
        """tract's input and output facts (``"B,10,f32"``), loading the model if needed."""
        session = self._session or self._open(None, True)
        with progress.stage("tract load+optimize"), named(self.path):
            return dict(session.load(None))

    def close(self) -> None:
        """Stop the tract process started by ``run`` (it also stops when the artifact is freed)."""
        if self._session is not None:
            self._session.close()
            self._session = None

    def __enter__(self) -> Artifact:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load(path: str | os.PathLike[str], limits: reader.Limits = reader.DEFAULT_LIMITS) -> Any:
    """Read and validate the artifact at ``path``; weights come back as numpy arrays.

    Besides ``graph.nnef``, ``graph.quant`` and ``.dat`` tensors, an archive may bundle what
    torchlower writes beside the graph (``reader.is_bundled``: configs, tokenizer, manifest,
    ``io/*.npz`` samples); they are checked and kept in ``Artifact.bundled``.
    """
    target = Path(path)
    if _is_lattice(target):  # runs in the reference executor (runner.LatticeArtifact)
        from torchlower.artifact.runner import LatticeArtifact

        return LatticeArtifact(target)
    parts = bundled.parts_of(target)
    if parts is not None:
        raise bundled.parts_error(target, parts)
    with named(target):
        return _load(target, target, limits)


def _load(source: Path, target: Path, limits: reader.Limits) -> Artifact:
    """``load`` of the bytes at ``source`` (a private copy of ``target``), errors naming ``target``."""
    members: dict[str, bytes] = {}
    with progress.stage("reading", unit="bytes"):
        for name, blob in reader.iter_members(source, limits):
            members[name] = blob
            progress.advance(len(blob))
    if "graph.nnef" not in members:
        raise ArtifactError(f"{target}: no graph.nnef at the top level of the artifact")
    extras = bundled.split(target, members, limits)
    extra = [n for n in members if n not in reader.TEXT_MEMBERS and not n.endswith(".dat")]
    if extra:
        raise ArtifactError(
            f"{target}: unexpected member {extra[0]!r} (an NNEF artifact holds graph.nnef, graph.quant,"
            f" .dat tensors and what torchlower bundles: {', '.join(reader.BUNDLED_FILES)},"
            f" {reader.SAMPLES_FOLDER}/*.npz)"
        )
    text = members.pop("graph.nnef")
    graph = parse(text)
    quant = members.pop("graph.quant", None)
    weights: dict[str, np.ndarray] = {}
    formats: dict[str, str] = {}
    stored: dict[str, int] = {}
    with progress.stage("decoding weights", total=len(graph.variables), unit="tensors"):
        decode_weights(target, graph, members, weights, formats, stored)
    unused = sorted(members)
    if unused:
        log.warning("%s: %d .dat file(s) no variable refers to, e.g. %s", target, len(unused), unused[0])
    return Artifact(
        target,
        reader.artifact_kind(source),
        graph,
        weights,
        formats,
        stored,
        quant.decode("utf-8", "replace") if quant is not None else None,
        unused,
        extras,
        bundled.properties(text),
    )


@contextlib.contextmanager
def named(target: Path) -> Iterator[None]:
    """Errors raised inside name the user's ``target``: a private copy's folder is replaced by it,
    and a message naming only a member gets ``target: `` in front."""
    try:
        yield
    except (ArtifactError, CheckError) as exc:
        message = reader.shown_as(str(exc), target)
        if not message.startswith(str(target)) and str(target) not in message:
            message = f"{target}: {message}"
        if message == str(exc):
            raise
        renamed = CheckError(message, exc.errors) if isinstance(exc, CheckError) else ArtifactError(message)
        raise renamed.with_traceback(exc.__traceback__) from None


def graph_text(path: str | os.PathLike[str], limits: reader.Limits = reader.DEFAULT_LIMITS) -> str:
    """The ``graph.nnef`` text of an artifact, after the container's checks (weights not decoded)."""
    with named(Path(path)):
        for name, blob in reader.iter_members(Path(path), limits):
            if name == "graph.nnef":
                parse(blob)  # the text must be one we would load
                return blob.decode("utf-8")
    raise ArtifactError(f"{path}: no graph.nnef at the top level of the artifact")


def inspect(
    path: str | os.PathLike[str], limits: reader.Limits = reader.DEFAULT_LIMITS, *, tract: bool = True
) -> dict[str, Any]:
    """A JSON-serializable summary: I/O, symbols, op histogram, weight bytes, extensions, and
    what the archive bundles (``bundled``: files, ``config.json``'s identity, the ``io/*.npz``
    samples' arrays, the graph's ``tract_core_properties``).

    With ``tract`` (the default) every output gets the shape and dtype tract derives when it
    loads the graph (symbolic where the graph is dynamic, e.g. ``["B", 10]``); without it, or
    when tract cannot load the graph, they are ``None``.
    """
    target = Path(path)
    if _is_lattice(target):
        return _lattice().inspect(target)
    parts = bundled.parts_of(target)
    if parts is not None:  # a folder of archives (an encoder-decoder): each part's summary
        manifest = json.loads((target / "manifest.json").read_text(encoding="utf-8"))
        summaries = {n: inspect(p, limits, tract=tract) for n, p in parts.items()}
        return {"path": str(target), "format": "parts", "manifest": manifest, "parts": summaries}
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
            {"name": i.name, "shape": [dim_text(d) for d in i.shape], "dtype": dtypes.name(i.dtype)}
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
        # what torchlower bundled beside the graph: files, the config's identity, samples, properties
        "bundled": bundled.summary(art.bundled, art.properties),
    }


def _output_facts(target: Path, limits: reader.Limits) -> list[tuple[list[Any], str]]:
    """(shape, dtype) of every output as tract derives them; empty if tract cannot load it."""
    from torchlower.nnef import session

    try:
        with progress.stage("tract load"), named(target), reader.extracted(target, limits) as folder:
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
    With none of ``inputs``, ``expected`` and ``model``, an archive that bundles ``io/*.npz``
    samples (``torchlower llm export --io-samples``) is compared with the outputs they recorded.
    Raises ``CheckError`` when an output differs beyond ``tolerance``.
    """
    from torchlower.core.comparison import compare
    from torchlower.nnef.tract import run_in_tract

    target = Path(path)
    if _is_lattice(target):
        return _lattice().check(target, inputs, expected, model, tolerance, seed=seed)
    if expected is not None and model is not None:
        raise InvalidArgumentError("give either expected= or model=, not both")
    parts = bundled.parts_of(target)
    if parts is not None:
        raise bundled.parts_error(target, parts)
    # tract reads exactly the bytes we validated; every error names the user's path
    with named(target), reader.extracted(target) as folder:
        art = _load(folder, target, reader.DEFAULT_LIMITS)
        recorded = bundled.samples(art.bundled, art.input_names, art.output_names)
        if recorded and inputs is None and expected is None and model is None:
            outs, errors, points = bundled.check_samples(folder, target, art.properties, recorded, tolerance)
            return CheckResult(recorded[0].inputs, outs, errors, points, comparison=bundled.COMPARISON)
        ins = inputs_for(art, inputs, symbol_sizes, seed)
        check_sum_bounds(_sizes(art.graph, ins), art.graph.extensions, target)
        if model is not None:
            from torchlower.artifact import model_check

            found = model_check.check(folder, target, art, ins, model, tolerance)
            errors = [e for p in found.points for e in p.errors]
            original = [e for p in found.original for e in p.errors]
            return CheckResult(ins, found.outputs, errors, found.points, original, found.comparison)
        outs = run_in_tract(folder, ins)
    names = art.output_names
    if expected is not None:
        want = arrays(expected, names, "expected")
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


def _sizes(graph: Graph, arrays: Sequence[np.ndarray]) -> dict[str, int]:
    """The size each plain symbol takes in these inputs (the first axis declared with it)."""
    env: dict[str, int] = {}
    for decl, array in zip(graph.inputs, arrays, strict=False):
        for dim, size in zip(decl.shape, array.shape, strict=False):
            if isinstance(dim, str):
                env.setdefault(dim, int(size))
    return env


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

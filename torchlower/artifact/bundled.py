"""What an archive carries besides its graph: configs, tokenizer, manifest, ``io/*.npz`` samples,
and the ``tract_core_properties`` the graph declares (``torchlower.llm.*`` provenance).

The members themselves are named by ``nnef/reader.py`` (``is_bundled``); here they are checked
as the untrusted bytes they are (JSON that parses, ``.npz`` samples numpy reads without
pickles, within the member size limit once decompressed) and summarized for ``inspect``; their
samples let ``check`` compare an archive with the outputs recorded when it was exported.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from torchlower.core import tolerance as tolerances
from torchlower.errors import ArtifactError
from torchlower.nnef import reader

# the default of ``torchlower.llm``'s f16 check (llm/exporter.F16_TOLERANCE, which artifact may not import)
F16_SCALE_TOLERANCE = 3e-2
_PROPERTIES = re.compile(
    r"fragment\s+tract_core_properties\s*\([^)]*\)[^{]*\{\s*properties\s*=\s*\[(.*?)\]\s*;", re.S
)
_ITEM = re.compile(r'\(\s*("(?:[^"\\]|\\.)*")\s*,\s*("(?:[^"\\]|\\.)*"|[-+]?[0-9][0-9.eE+-]*)\s*\)')
COMPARISON = "outputs recorded at export (io/*.npz)"
_CONFIG_KEYS = ("model_type", "architectures", "torch_dtype", "dtype", "vocab_size")


@dataclass(frozen=True)
class Sample:
    """One ``io/*.npz``: graph inputs and the outputs recorded at export, in graph order."""

    name: str
    inputs: list[np.ndarray]
    expected: list[np.ndarray]
    output_names: list[str]


def split(target: Path, members: dict[str, bytes], limits: reader.Limits) -> dict[str, bytes]:
    """Pop the bundled members out of ``members``, each checked; by name, sorted."""
    out: dict[str, bytes] = {}
    for name in sorted(n for n in members if reader.is_bundled(n)):
        blob = members.pop(name)
        _check(target, name, blob, limits)
        out[name] = blob
    return out


def properties(graph_text: bytes | str) -> dict[str, str | int | float]:
    """The ``tract_core_properties`` of a graph's text, key → value (empty without the fragment)."""
    text = graph_text.decode("utf-8", "replace") if isinstance(graph_text, bytes) else graph_text
    found = _PROPERTIES.search(text)
    if found is None:
        return {}
    props: dict[str, str | int | float] = {}
    for key, value in _ITEM.findall(found.group(1)):
        try:
            props[json.loads(key)] = json.loads(value)
        except ValueError:
            props[json.loads(key)] = value
    return props


def summary(bundled: Mapping[str, bytes], props: Mapping[str, Any]) -> dict[str, Any]:
    """What ``inspect`` shows of the bundle: files and sizes, the config's identity, samples, properties."""
    files = [{"name": n, "bytes": len(b), "kind": _kind(n)} for n, b in bundled.items()]
    out: dict[str, Any] = {"files": files, "properties": dict(sorted(props.items()))}
    if "config.json" in bundled:
        config = json.loads(bundled["config.json"])
        if isinstance(config, dict):
            out["config"] = {k: config[k] for k in _CONFIG_KEYS if k in config}
    samples = {}
    for name, blob in bundled.items():
        if name.endswith(".npz"):
            with np.load(io.BytesIO(blob), allow_pickle=False) as data:
                samples[name] = {k: {"shape": list(data[k].shape), "dtype": str(data[k].dtype)} for k in data}
    if samples:
        out["samples"] = samples
    if "manifest.json" in bundled:
        out["manifest"] = json.loads(bundled["manifest.json"])
    return out


def samples(bundled: Mapping[str, bytes], inputs: Sequence[str], outputs: Sequence[str]) -> list[Sample]:
    """The bundled samples that hold every graph input and output (``io/generation.npz`` does not)."""
    found = []
    for name, blob in bundled.items():
        if not name.endswith(".npz"):
            continue
        with np.load(io.BytesIO(blob), allow_pickle=False) as data:
            if all(k in data for k in (*inputs, *outputs)):
                ins, outs = [data[k] for k in inputs], [data[k] for k in outputs]
                found.append(Sample(name, ins, outs, list(outputs)))
    return found


def sample_tolerance(props: Mapping[str, Any], want: Sequence[np.ndarray]) -> float:
    """The tolerance ``torchlower.llm.export``'s own check used for an archive of these properties."""
    if props.get("torchlower.llm.precision") == "f16":
        return F16_SCALE_TOLERANCE * tolerances.output_scale(want)
    tol = tolerances.default(want)
    if props.get("torchlower.llm.compress", "none") != "none":
        tol = max(tol, 1e-3 * tolerances.output_scale(want))  # q4_0 blocks reorder the f32 sums
    return tol


def check_samples(
    folder: Path, target: Path, props: Mapping[str, Any], found: Sequence[Sample], tolerance: float | None
) -> tuple[list[np.ndarray], list[Any], list[Any]]:
    """Run every sample in tract (one load); tract's outputs of the first, the errors of all and
    one ``CheckPoint`` per sample. Raises ``CheckError`` naming the sample and output that differ."""
    from torchlower.core.comparison import compare
    from torchlower.errors import CheckError
    from torchlower.nnef.tract import run_points_in_tract
    from torchlower.pipeline.verification import CheckPoint

    got = run_points_in_tract(folder, [s.inputs for s in found])
    errors: list[Any] = []
    points = []
    for sample, outs in zip(found, got, strict=True):
        tol = tolerance if tolerance is not None else sample_tolerance(props, sample.expected)
        names = [f"{n} ({sample.name})" for n in sample.output_names]
        found_errors = compare(names, sample.expected, outs, tol)
        points.append(CheckPoint(sample.name, [tuple(a.shape) for a in sample.inputs], found_errors))
        errors += found_errors
    bad = [e for e in errors if not e.ok]
    if bad:
        detail = "; ".join(f"{e.name}: max abs {e.max_abs:.3g} > {e.tolerance:.3g}" for e in bad)
        raise CheckError(f"{target}: tract differs from the {COMPARISON} — {detail}", errors)
    return got[0], errors, points


def parts_of(path: Path) -> dict[str, Path] | None:
    """The archives of a folder torchlower wrote as several graphs (``manifest.json`` beside
    ``encoder.nnef.tgz`` / ``decoder.nnef.tgz``, no graph of its own), by part; None otherwise."""
    if not path.is_dir() or (path / "graph.nnef").exists() or not (path / "manifest.json").is_file():
        return None
    try:
        manifest = json.loads((path / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ArtifactError(f"{path / 'manifest.json'}: not readable JSON ({exc})") from None
    parts = {}
    for name, entry in manifest.items() if isinstance(manifest, dict) else []:
        archive = entry.get("archive") if isinstance(entry, dict) else None
        if isinstance(archive, str):
            reader.check_name(archive)  # inside the folder: no absolute path, no ".."
            parts[name] = path / archive
    if not parts:
        raise ArtifactError(f'{path / "manifest.json"}: names no archive (parts with an "archive" entry)')
    return parts


def parts_error(path: Path, parts: Mapping[str, Path]) -> ArtifactError:
    """``load`` / ``check`` / ``run`` take one graph: name the archives of a multi-graph folder."""
    listing = ", ".join(f"{name} {p}" for name, p in parts.items())
    return ArtifactError(
        f"{path}: a folder of {len(parts)} archives (manifest.json: {listing}); give one of them, or"
        " use torchlower.llm.generate for the whole model"
    )


def _check(target: Path, name: str, blob: bytes, limits: reader.Limits) -> None:
    if name.endswith(".json"):
        try:
            json.loads(blob.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            raise ArtifactError(f"{target}: bundled {name!r} is not JSON ({exc})") from None
    elif name.endswith(".npz"):
        _check_npz(target, name, blob, limits)


def _check_npz(target: Path, name: str, blob: bytes, limits: reader.Limits) -> None:
    try:
        with zipfile.ZipFile(io.BytesIO(blob)) as zf:
            entries = zf.infolist()
            if sum(e.file_size for e in entries) > limits.max_member_bytes:
                raise ArtifactError(
                    f"{target}: bundled {name!r} decompresses past {limits.max_member_bytes} bytes"
                    " (limit max_member_bytes)"
                )
        with np.load(io.BytesIO(blob), allow_pickle=False) as data:
            for key in data:
                data[key]  # reads and checks each array
    except ArtifactError:
        raise
    except (zipfile.BadZipFile, ValueError, OSError, EOFError, KeyError) as exc:
        raise ArtifactError(f"{target}: bundled {name!r} is not a readable .npz ({exc})") from None


def _kind(name: str) -> str:
    if name.endswith(".npz"):
        return "sample"
    if name == "manifest.json":
        return "manifest"
    if "config" in name and not name.startswith("tokenizer"):
        return "config"
    return "tokenizer"

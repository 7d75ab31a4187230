"""Reading lattice folders back: ``load``, ``inspect`` and ``check`` (what ``torchlower.artifact.io`` and
the CLI call for a folder holding ``graph.mlir``).

Folders are untrusted: anything malformed becomes an ``ArtifactError`` naming the file. ``check``
runs the reference executor and compares with a model (eager PyTorch) or expected arrays;
without inputs it draws random ones from what the graph says about each input (its role, the
ops that read it, a sparse input's stride).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchlower.errors import ArtifactError, InvalidArgumentError
from torchlower.lattice import verify
from torchlower.lattice.builder import WEIGHT_FILE
from torchlower.lattice.executor import Artifact, Op, execute, parse_artifact, split_ops
from torchlower.lattice.sparse import SparseTensor

GRAPH_FILE = "graph.mlir"
RANDOM_ROWS = 64  # rows of random inputs (the reference executor is brute force)
TORCH = {"f32": torch.float32, "f16": torch.float16, "i32": torch.int32, "i64": torch.int64}


@dataclass
class Folder:
    """A validated lattice folder: the parsed artifact plus what the summary needs."""

    path: Path
    artifact: Artifact
    input_types: list[str]
    output_types: list[str]
    stored: dict[str, tuple[str, list[int], int]]  # safetensors key → (dtype, shape, bytes)
    text: str


def load(path: str | os.PathLike[str]) -> Folder:
    """Read and validate the folder at ``path`` (exactly ``graph.mlir`` + ``weights.safetensors``)."""
    from safetensors import SafetensorError, safe_open
    from safetensors.torch import load_file

    folder = Path(path)
    names = sorted(p.name for p in folder.iterdir())
    if names != sorted((GRAPH_FILE, WEIGHT_FILE)):
        raise ArtifactError(
            f"{folder}: a lattice artifact holds exactly {GRAPH_FILE} and {WEIGHT_FILE}; found {names}"
        )
    try:
        text = (folder / GRAPH_FILE).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"{folder / GRAPH_FILE}: not UTF-8 text ({exc})") from None
    try:
        tensors = load_file(str(folder / WEIGHT_FILE))
        with safe_open(str(folder / WEIGHT_FILE), "pt") as f:
            stored = {}
            for key in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                t = tensors[key]
                stored[key] = (
                    str(t.dtype).removeprefix("torch."),
                    list(t.shape),
                    t.numel() * t.element_size(),
                )
    except (SafetensorError, OSError, ValueError) as exc:
        raise ArtifactError(f"{folder / WEIGHT_FILE}: not a readable safetensors file ({exc})") from None
    try:
        art = parse_artifact(text, tensors)
        in_types, out_types = _signature(text)
    except ArtifactError as exc:
        raise ArtifactError(f"{folder / GRAPH_FILE}: {exc}") from None
    except (ValueError, KeyError, IndexError, AttributeError, StopIteration, TypeError) as exc:
        raise ArtifactError(
            f"{folder / GRAPH_FILE}: malformed lattice IR ({type(exc).__name__}: {exc})"
        ) from None
    if len(in_types) != len(art.input_names) or len(out_types) != len(art.output_names):
        raise ArtifactError(f"{folder / GRAPH_FILE}: the signature does not match lattice.input/output_names")
    return Folder(folder, art, in_types, out_types, stored, text)


def _signature(text: str) -> tuple[list[str], list[str]]:
    head = re.search(r"func\.func @forward\((.*?)\n\s*\) -> (.*?) \{\n", text, re.S)
    if head is None:
        raise ArtifactError("no func.func @forward signature")
    ins = [t for _, t in re.findall(r"%(\w+): (.+?),?\n", head.group(1) + "\n")]
    result = head.group(2)
    outs = split_ops(result[1:-1]) if result.startswith("(") else [result]
    return ins, outs


def inspect(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A JSON-serializable summary: inputs with roles, outputs, op histogram, weights by packing,
    digests."""
    f = load(path)
    art = f.artifact
    weights = [o for o in art.ops if o.op == "weight"]
    by_packing: Counter[str] = Counter()
    for op in weights:
        key, packing = op.attrs["storage_key"], op.attrs["packing"]
        keys = [key] if packing == "dense" else [f"{key}.{p}" for p in ("weight", "scales", "biases")]
        by_packing[_packing_label(packing)] += sum(f.stored[k][2] for k in keys if k in f.stored)
    digest = hashlib.sha256()
    for name in (GRAPH_FILE, WEIGHT_FILE):
        digest.update((f.path / name).read_bytes())
    schema = re.search(r'lattice\.schema_digest = "([0-9a-f]+)"', f.text)
    ops = Counter(o.op for o in art.ops)
    return {
        "path": str(f.path),
        "format": "lattice",
        "ir_version": 2,
        "schema_digest": schema.group(1) if schema else None,
        "sha256": digest.hexdigest(),
        "inputs": [
            {"name": n, "role": r, "type": t, **_shape_dtype(t)}
            for n, r, t in zip(art.input_names, art.input_roles, f.input_types, strict=True)
        ],
        "outputs": [
            {"name": n, "role": r, "type": t, **_shape_dtype(t)}
            for n, r, t in zip(art.output_names, art.output_roles, f.output_types, strict=True)
        ],
        "ops": dict(sorted(ops.items(), key=lambda kv: (-kv[1], kv[0]))),
        "op_count": len(art.ops),
        "weights": {
            "count": len(weights),
            "tensors": len(f.stored),
            "bytes": sum(b for _, _, b in f.stored.values()),
            "bytes_by_packing": dict(sorted(by_packing.items())),
        },
    }


def _packing_label(packing: str) -> str:
    """``int8, group_size = 32, scale_dtype = f32, mode = affine`` → ``int8 g32 f32-scales``."""
    if packing == "dense":
        return "dense f32"
    parts = dict(p.split(" = ") for p in packing.split(", ")[1:] if " = " in p)
    return f"{packing.split(',')[0]} g{parts.get('group_size', '?')} {parts.get('scale_dtype', '?')}-scales"


def _shape_dtype(type_text: str) -> dict[str, Any]:
    m = re.fullmatch(r"tensor<((?:[0-9?]+x)*)(\w+)>", type_text)
    if m is None:
        dtype = re.search(r"dtype = (\w+)", type_text)
        return {"shape": ["?", "?"], "dtype": dtype.group(1) if dtype else "?", "sparse": True}
    dims = [d if d == "?" else int(d) for d in m.group(1).split("x")[:-1]]
    return {"shape": dims, "dtype": m.group(2), "sparse": False}


@dataclass
class CheckResult:
    """ABI inputs used, outputs (sparse ones as features in row order) and per-output errors."""

    inputs: list[np.ndarray]
    outputs: list[np.ndarray]
    errors: list[Any]  # torchlower.core.comparison.OutputError
    sparse_outputs: list[SparseTensor | None] | None = None

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
    seed: int = 0,
) -> CheckResult:
    """Run the folder in the reference executor; compare with ``model`` (eager, on the same inputs
    as ``SparseTensor``s) or ``expected`` arrays (sparse outputs: features in row order).

    ``inputs`` are ABI arrays (by name or in order) or model-level values (``SparseTensor`` for
    a sparse input); without them random ones are drawn. Raises ``CheckError`` on a mismatch."""
    from torch import nn

    if expected is not None and model is not None:
        raise InvalidArgumentError("give either expected= or model=, not both")
    f = load(path)
    art = f.artifact
    flat = _abi_inputs(f, inputs, seed)
    ran = execute(art, flat)
    arrays = [verify.as_array(r) for r in ran]
    used = [t.numpy() for t in flat]
    sparse = [r if isinstance(r, SparseTensor) else None for r in ran]
    if model is None and expected is None:
        return CheckResult(used, arrays, [], sparse)
    if model is not None:
        if not isinstance(model, nn.Module):
            raise InvalidArgumentError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        from torchlower.core.model_io import eval_view

        eager = verify.eager_outputs(eval_view(model), model_inputs(art, flat))
    else:
        eager = [torch.from_numpy(np.asarray(a)) for a in _named(expected, art.output_names, "expected")]
        ran = [torch.from_numpy(a) for a in arrays]
    errors = verify.compare(art.output_names, eager, ran, tolerance)
    verify.raise_on_mismatch(errors, str(f.path))
    return CheckResult(used, arrays, errors, sparse)


def _named(values: Sequence[Any] | Mapping[str, Any], names: Sequence[str], what: str) -> list[Any]:
    if isinstance(values, Mapping):
        missing = [n for n in names if n not in values]
        extra = [k for k in values if k not in names]
        if missing or extra:
            raise InvalidArgumentError(
                f"{what} keys must be {list(names)}; missing {missing}, unexpected {extra}"
            )
        return [values[n] for n in names]
    items = list(values)
    if len(items) != len(names):
        raise InvalidArgumentError(f"{len(items)} {what} for {len(names)} artifact tensors {list(names)}")
    return items


def _makes(art: Artifact) -> dict[str, Op]:
    """``sparse.make`` of each sparse input, by its coordinates argument."""
    return {o.operands[0]: o for o in art.ops if o.op == "sparse.make"}


def model_inputs(art: Artifact, flat: Sequence[torch.Tensor]) -> list[Any]:
    """ABI tensors → the model's arguments: each coords/features/active triple a ``SparseTensor``."""
    makes, out, i = _makes(art), [], 0
    while i < len(flat):
        name = art.input_names[i]
        if art.input_roles[i] == "sparse_coords" and name in makes:
            coords, feats, active = flat[i : i + 3]
            n = int(active.reshape(-1)[0])
            out.append(SparseTensor(feats[:n], coords[:n], tuple(makes[name].attrs["stride"])))
            i += 3
        else:
            out.append(flat[i])
            i += 1
    return out


def _abi_inputs(f: Folder, given: Any, seed: int) -> list[torch.Tensor]:
    art = f.artifact
    if given is None:
        return random_inputs(f, seed)
    items = given if isinstance(given, Mapping) else list(given)
    if not isinstance(items, Mapping) and any(isinstance(x, SparseTensor) for x in items):
        flat: list[torch.Tensor] = []
        for x in items:
            if isinstance(x, SparseTensor):
                flat += [x.coords, x.feats, torch.tensor([x.coords.shape[0]], dtype=torch.int32)]
            else:
                flat.append(torch.as_tensor(x))
        items = flat
    arrays = [torch.as_tensor(np.asarray(a)) for a in _named(items, art.input_names, "inputs")]
    for name, t, a in zip(art.input_names, f.input_types, arrays, strict=True):
        want = _shape_dtype(t)
        if a.dtype != TORCH.get(want["dtype"]):
            raise InvalidArgumentError(f"input {name!r} is declared {t} but got {a.dtype}")
        if len(want["shape"]) != a.dim() or any(
            d != "?" and d != s for d, s in zip(want["shape"], a.shape, strict=True)
        ):
            raise InvalidArgumentError(f"input {name!r} has shape {list(a.shape)}, the graph declares {t}")
    return arrays


def random_inputs(f: Folder, seed: int) -> list[torch.Tensor]:
    """Inputs drawn from the graph: sparse inputs get random voxels at their stride; dense ones are
    shaped by the ops that read them (points inside a 16-voxel box, batch indices, row counts)."""
    art = f.artifact
    gen = torch.Generator().manual_seed(seed)
    batches = max([int(o.attrs["batch_size"]) for o in art.ops if o.op == "global_pool"] or [2])
    makes = _makes(art)
    uses = {
        (name, i, o.op, tuple(o.attrs.get("voxel_size", ())), tuple(o.attrs.get("origin", ())))
        for o in art.ops
        for i, name in enumerate(o.operands)
    }
    out: list[torch.Tensor] = []
    i = 0
    while i < len(art.input_names):
        name, role = art.input_names[i], art.input_roles[i]
        if role == "sparse_coords" and name in makes:
            stride = torch.tensor(makes[name].attrs["stride"])
            coords = torch.cat(
                [
                    torch.randint(0, batches, (RANDOM_ROWS, 1), generator=gen),
                    torch.randint(-4, 4, (RANDOM_ROWS, 3), generator=gen) * stride,
                ],
                dim=1,
            )
            coords = torch.unique(coords, dim=0).int()
            feature = _shape_dtype(f.input_types[i + 1])
            feats = torch.randn(len(coords), feature["shape"][-1], generator=gen)
            feats = feats.to(TORCH.get(feature["dtype"], torch.float32))
            out += [coords, feats, torch.tensor([len(coords)], dtype=torch.int32)]
            i += 3
            continue
        out.append(_random_dense(f.input_types[i], {u for u in uses if u[0] == name}, batches, gen))
        i += 1
    return out


def _random_dense(type_text: str, uses: set[tuple], batches: int, gen: torch.Generator) -> torch.Tensor:
    info = _shape_dtype(type_text)
    shape = [RANDOM_ROWS if d == "?" else d for d in info["shape"]]
    dtype = TORCH.get(info["dtype"], torch.float32)
    positions = {u[1] for u in uses if u[2] in ("voxelize", "devoxelize")}
    if 3 in positions:  # active rows
        return torch.full([1], RANDOM_ROWS, dtype=dtype)
    if 2 in positions:  # batch indices
        return torch.randint(0, batches, shape, generator=gen).to(dtype)
    if 0 in positions:  # points: inside a box of 16 voxels from the origin
        _, _, _, size, origin = next(u for u in uses if u[1] == 0)
        box = torch.rand(shape, generator=gen, dtype=torch.float64) * 16
        return (box * torch.tensor(size) + torch.tensor(origin)).to(dtype)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(0, 2, shape, generator=gen).to(dtype)

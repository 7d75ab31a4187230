"""``save`` (model → lattice artifact folder, through the FX front end), ``load`` and ``run``."""

from __future__ import annotations

import inspect
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from torchlower.errors import ArtifactError, InvalidArgumentError, LoweringError
from torchlower.lattice.builder import WEIGHT_FILE, LatticeBuilder
from torchlower.lattice.executor import Artifact, execute, parse_artifact
from torchlower.lattice.sparse import SparseTensor
from torchlower.values import Value

GRAPH_FILE = "graph.mlir"


def save(
    model: nn.Module,
    folder: str | os.PathLike[str],
    example_inputs: Any,
    *,
    output_names: Sequence[str] | None = None,
    input_dtype: str = "f32",
    batch_size: int | None = None,
    quantize_bits: int | None = None,
    group_size: int = 32,
    scale_dtype: str = "f16",
) -> Path:
    """Lower ``model`` (eval mode) called on ``example_inputs`` into ``folder``.

    A sparse example input ``x`` becomes the arguments ``x_coords`` / ``x_features`` /
    ``x_active``; a dense one a tensor argument. The folder is replaced atomically: on any
    failure the previous artifact stays as it was.
    """
    if not isinstance(model, nn.Module):
        raise InvalidArgumentError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    training = sorted(name or type(model).__name__ for name, m in model.named_modules() if m.training)
    if training:
        raise InvalidArgumentError(
            f"model must be in eval mode (call .eval()); training: {', '.join(training)}"
        )
    examples = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    builder = LatticeBuilder(
        input_dtype=input_dtype,
        quantize_bits=quantize_bits,
        group_size=group_size,
        scale_dtype=scale_dtype,
        batch_size=batch_size,
        module_names={id(m): name for name, m in model.named_modules()},
    )
    inputs = [
        _declare(builder, name, x) for name, x in zip(_input_names(model, examples), examples, strict=True)
    ]
    outputs = _lower(builder, model, inputs)
    bad = sorted({type(o).__name__ for o in outputs if not isinstance(o, Value)})
    if bad:
        raise LoweringError(f"model outputs must be sparse or dense tensors; found {', '.join(bad)}")
    names = list(output_names) if output_names is not None else _default_names(len(outputs))
    if len(names) != len(outputs):
        raise InvalidArgumentError(f"{len(names)} output names for {len(outputs)} outputs")
    builder.set_outputs(names, outputs)
    text, weights = builder.graph_text(), builder.live_weights()
    cross_check(text, weights)
    return write(Path(folder), text, weights)


def _lower(builder: LatticeBuilder, model: nn.Module, inputs: list[Value]) -> list[Any]:
    """Trace with ``torchlower.fx.Tracer`` (rule-bearing modules stay leaves) and interpret."""
    from torchlower import fx

    gm = fx.trace(model, builder.rules)
    return pytree.tree_leaves(fx.Interpreter(gm, builder).run(*inputs))


def _declare(builder: LatticeBuilder, name: str, x: Any) -> Value:
    if isinstance(x, SparseTensor):
        return builder.sparse_input(name, x.num_channels, x.stride)
    if isinstance(x, torch.Tensor):
        if x.dim() == 0:
            raise InvalidArgumentError(f"input {name}: scalar tensors are not lattice inputs")
        return builder.dense_input(name, x)
    raise InvalidArgumentError(f"input {name} must be a SparseTensor or a tensor, got {type(x).__name__}")


def _input_names(model: nn.Module, examples: Sequence[Any]) -> list[str]:
    params = list(inspect.signature(model.forward).parameters)
    if len(params) < len(examples):
        raise InvalidArgumentError(f"{len(examples)} example inputs for forward({', '.join(params)})")
    return params[: len(examples)]


def _default_names(n: int) -> list[str]:
    return ["output"] if n == 1 else [f"output_{i}" for i in range(n)]


_STORAGE_KEY = re.compile(r'storage_key = "([^"]+)".*packing = #lattice\.packing<(\w+)')


def cross_check(text: str, weights: dict[str, torch.Tensor]) -> None:
    """The weights the graph references and the tensors stored must be the same set."""
    wanted: set[str] = set()
    for key, packing in _STORAGE_KEY.findall(text):
        wanted |= {key} if packing == "dense" else {f"{key}.weight", f"{key}.scales", f"{key}.biases"}
    if wanted != set(weights):
        raise ArtifactError(
            f"graph/weights mismatch: referenced but not stored {sorted(wanted - set(weights))}, "
            f"stored but not referenced {sorted(set(weights) - wanted)}"
        )


def write(folder: Path, text: str, weights: dict[str, torch.Tensor]) -> Path:
    """Write into a temporary sibling folder, then swap it in (old artifact kept on failure)."""
    from safetensors.torch import save_file

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        (tmp / GRAPH_FILE).write_text(text, encoding="utf-8")
        save_file(
            {k: v.contiguous() for k, v in weights.items()},
            str(tmp / WEIGHT_FILE),
            metadata={"format": "torch"},
        )
        from torchlower.nnef.archive import publish_mode

        publish_mode(tmp, directory=True)  # mkdtemp made it 0700; the artifact honours the umask
        old = None
        if folder.exists():
            old = folder.parent / f".{folder.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            folder.rename(old)
        tmp.rename(folder)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def load(folder: str | os.PathLike[str]) -> Artifact:
    """Parse ``graph.mlir`` and load ``weights.safetensors`` (packed weights dequantized)."""
    from safetensors.torch import load_file

    path = Path(folder)
    if not (path / GRAPH_FILE).is_file() or not (path / WEIGHT_FILE).is_file():
        raise ArtifactError(f"{path} is not a lattice artifact (needs {GRAPH_FILE} and {WEIGHT_FILE})")
    return parse_artifact((path / GRAPH_FILE).read_text(encoding="utf-8"), load_file(str(path / WEIGHT_FILE)))


def run(artifact: Artifact | str | os.PathLike[str], inputs: Any) -> list[Any]:
    """Execute ``artifact`` with the reference executor on the model-level ``inputs`` (sparse
    inputs as ``SparseTensor``). Sparse outputs come back as ``SparseTensor`` in (batch, x, y, z)
    row order; dense outputs as tensors."""
    art = artifact if isinstance(artifact, Artifact) else load(artifact)
    items = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    flat: list[torch.Tensor] = []
    for x in items:
        if isinstance(x, SparseTensor):
            flat += [x.coords, x.feats, torch.tensor([x.coords.shape[0]], dtype=torch.int32)]
        else:
            flat.append(x)
    return execute(art, flat)

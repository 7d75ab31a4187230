"""``save`` (model → lattice artifact folder, through the FX front end), ``load`` and ``run``."""

from __future__ import annotations

import inspect
import logging
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from torchlower.core.comparison import OutputError
from torchlower.core.staging import move, publish_mode
from torchlower.core.values import Value
from torchlower.errors import ArtifactError, InvalidArgumentError, LoweringError, UnsupportedOpsError
from torchlower.lattice import verify
from torchlower.lattice.builder import WEIGHT_FILE, LatticeBuilder
from torchlower.lattice.executor import Artifact, execute
from torchlower.lattice.rules import LATTICE_RULES
from torchlower.lattice.sparse import SparseTensor

GRAPH_FILE = "graph.mlir"
log = logging.getLogger("torchlower")


@dataclass
class SaveReport:
    """What ``save`` wrote and how the reference executor compares with eager PyTorch.

    ``errors`` covers the example inputs (output names as given) and ``fresh`` random inputs of
    the same structure (``"<name> (random i)"``); empty when ``check=False``.
    """

    path: Path
    inputs: list[str]
    outputs: list[str]
    op_histogram: Counter[str]
    weight_bytes: int
    errors: list[OutputError] = field(default_factory=list)
    fresh: int = 0

    @property
    def checked(self) -> bool:
        return bool(self.errors)

    @property
    def max_abs_error(self) -> float:
        return max((e.max_abs for e in self.errors), default=0.0)


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
    check: bool = True,
    tolerance: float | None = None,
    fresh_inputs: int = 2,
) -> SaveReport:
    """Lower ``model`` called on ``example_inputs`` into ``folder`` and verify it.

    A sparse example input ``x`` becomes the arguments ``x_coords`` / ``x_features`` /
    ``x_active``; a dense one a tensor argument. A model in training mode is lowered from an
    eval-mode copy (with a warning), like ``torchlower.export``; the caller's model is never
    modified. With ``check`` the artifact runs in the reference executor on the example inputs
    and on ``fresh_inputs`` random inputs of the same structure, against eager PyTorch (with the
    dequantized weights when ``quantize_bits`` is set); a mismatch raises ``CheckError`` after
    the folder is written. The folder is replaced atomically: on a lowering failure the previous
    artifact stays as it was.
    """
    if not isinstance(model, nn.Module):
        raise InvalidArgumentError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    from torchlower.core.model_io import eval_view

    module = eval_view(model)
    examples = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) else (example_inputs,)
    builder = LatticeBuilder(
        input_dtype=input_dtype,
        quantize_bits=quantize_bits,
        group_size=group_size,
        scale_dtype=scale_dtype,
        batch_size=batch_size,
        module_names=_module_names(module, LATTICE_RULES),
        rules=LATTICE_RULES,
    )
    in_names = _input_names(module, examples)
    inputs = [_declare(builder, name, x) for name, x in zip(in_names, examples, strict=True)]
    outputs = _lower(builder, module, inputs)
    bad = sorted({type(o).__name__ for o in outputs if not isinstance(o, Value)})
    if bad:
        raise LoweringError(f"model outputs must be sparse or dense tensors; found {', '.join(bad)}")
    names = list(output_names) if output_names is not None else _default_names(len(outputs))
    if len(names) != len(outputs):
        raise InvalidArgumentError(f"{len(names)} output names for {len(outputs)} outputs")
    builder.set_outputs(names, outputs)
    text, weights = builder.graph_text(), builder.live_weights()
    cross_check(text, weights)
    path = write(Path(folder), text, weights)
    report = SaveReport(
        path,
        [n for n, _, _ in builder.inputs],
        names,
        Counter(re.findall(r"= lattice\.([\w.]+)", text)),
        sum(t.numel() * t.element_size() for t in weights.values()),
    )
    if check:
        report.errors, report.fresh = _verify(path, module, builder, examples, names, tolerance, fresh_inputs)
    return report


def _verify(
    path: Path,
    module: nn.Module,
    builder: LatticeBuilder,
    examples: tuple[Any, ...],
    names: list[str],
    tolerance: float | None,
    fresh: int,
) -> tuple[list[OutputError], int]:
    """Reference executor vs eager on the example and ``fresh`` random inputs like it."""
    artifact = load(path)
    reference = verify.dequantized_copy(module, builder.packed)
    runs = [(examples, names)] + [
        (verify.fresh_inputs(examples, seed), [f"{n} (random {seed})" for n in names])
        for seed in range(1, fresh + 1)
    ]
    if tolerance is None and builder.feature_dtype == torch.float16:
        tolerance = 1e-2
    errors: list[OutputError] = []
    for inputs, labels in runs:
        eager = verify.eager_outputs(reference, inputs)
        errors += verify.compare(labels, eager, run(artifact, inputs), tolerance)
    for e in errors:
        log.info("output %s: max |torch - reference| = %.3g (rel %.3g)", e.name, e.max_abs, e.max_rel)
    verify.raise_on_mismatch(errors, str(path))
    return errors, fresh


def _module_names(model: nn.Module, rules: Any) -> dict[int, str]:
    """Dotted paths by module identity; a model that is itself one rule-bearing module is named
    after its type in lower case, as the reference names it (``SubmConv3d`` → ``submconv3d``)."""
    names = {id(m): name for name, m in model.named_modules()}
    if rules.lookup_module(type(model)) is not None:
        names[id(model)] = type(model).__name__.lower()
    return names


def _lower(builder: LatticeBuilder, model: nn.Module, inputs: list[Value]) -> list[Any]:
    """Trace with ``torchlower.fx.Tracer`` (rule-bearing modules stay leaves) and interpret; a
    model that is one rule-bearing module goes straight to its rule."""
    from torchlower.frontends import fx
    from torchlower.frontends.session import Session

    if builder.rules.lookup_module(type(model)) is not None:
        session = Session(builder, "fx")
        bound = inspect.signature(model.forward).bind(*inputs)
        bound.apply_defaults()
        out = session.apply_module(model, list(bound.arguments.values()), builder.module_names[id(model)])
        try:
            session.finish()
        except UnsupportedOpsError as exc:
            raise UnsupportedOpsError(exc.ops, exc.frontend, registry="lattice") from None
        return pytree.tree_leaves(out)
    gm = fx.trace(model, builder.rules)
    try:
        return pytree.tree_leaves(fx.Interpreter(gm, builder).run(*inputs))
    except UnsupportedOpsError as exc:  # name the lattice registry and its extension point
        raise UnsupportedOpsError(exc.ops, exc.frontend, registry="lattice") from None


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
    """Write into a temporary sibling folder, then swap it in (old artifact kept on failure);
    the staged writing both targets share (``core.staging``)."""
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
        publish_mode(tmp, directory=True)  # mkdtemp made it 0700; the artifact honours the umask
        move(tmp, folder)  # the old folder goes aside, then this one takes its name
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return folder


def load(folder: str | os.PathLike[str]) -> Artifact:
    """Parse and validate the folder (``lattice.io.load``); packed weights come back dequantized."""
    from torchlower.lattice import io

    return io.load(folder).artifact


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

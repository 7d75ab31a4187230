"""Sparse point-cloud networks in plain PyTorch, and their lowering to the lattice artifact.

``SparseTensor`` + modules + functions run eagerly on CPU; ``save`` lowers a model through the
FX front end into ``graph.mlir`` + ``weights.safetensors``; ``load`` / ``run`` parse and execute
such a folder with an independent reference executor.
"""

from __future__ import annotations

from typing import Any

from torchlower.lattice.functional import (
    add,
    cat,
    devoxelize,
    maximum,
    minimum,
    mul,
    reindex_sparse,
    sub,
    voxelize,
)
from torchlower.lattice.modules import (
    AvgPool3d,
    BatchNorm,
    Conv3d,
    ConvTranspose3d,
    GenerativeConvTranspose3d,
    GlobalAvgPool,
    GlobalMaxPool,
    MaxPool3d,
    SubmConv3d,
    SumPool3d,
)
from torchlower.lattice.modules_ops import (
    Elementwise,
    NormalizedConvTranspose3d,
    NormalizedGenerativeConvTranspose3d,
    NormalizedSubmConv3d,
    PoolTranspose3d,
    TrilinearUpsample3d,
)
from torchlower.lattice.sparse import SparseTensor

__all__ = [
    "AvgPool3d",
    "BatchNorm",
    "Conv3d",
    "ConvTranspose3d",
    "Elementwise",
    "GenerativeConvTranspose3d",
    "GlobalAvgPool",
    "GlobalMaxPool",
    "MaxPool3d",
    "NormalizedConvTranspose3d",
    "NormalizedGenerativeConvTranspose3d",
    "NormalizedSubmConv3d",
    "PoolTranspose3d",
    "SparseTensor",
    "SubmConv3d",
    "SumPool3d",
    "TrilinearUpsample3d",
    "add",
    "cat",
    "devoxelize",
    "load",
    "maximum",
    "minimum",
    "mul",
    "register_function_rule",
    "register_module_rule",
    "reindex_sparse",
    "run",
    "save",
    "sub",
    "voxelize",
]


def register_module_rule(*types: type) -> Any:
    """Decorator: ``fn(builder, module, *inputs)`` lowers modules of ``types`` (and subclasses)
    into the lattice artifact. Registering a type twice raises ``InvalidArgumentError``."""
    from torchlower.lattice.rules import LATTICE_RULES

    return LATTICE_RULES.module(*types)


def register_function_rule(*keys: object) -> Any:
    """Decorator: ``fn(builder, *args)`` lowers calls of a Python function (arguments in its
    signature order) or of an ATen op (schema order) into the lattice artifact."""
    from torchlower.lattice.rules import LATTICE_RULES

    return LATTICE_RULES.function(*keys)


def __getattr__(name: str) -> Any:
    if name in ("save", "load", "run"):
        from torchlower.lattice import api

        return getattr(api, name)
    raise AttributeError(f"module 'torchlower.lattice' has no attribute {name!r}")

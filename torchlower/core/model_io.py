"""How export sees a model's inputs and outputs: an eval-mode view that leaves the caller's model
untouched, input and output names from the signature and the returned structure, and the
outputs as a flat list of tensors (with the way out when they are not)."""

from __future__ import annotations

import contextlib
import copy
import inspect
import logging
import re
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from torchlower.errors import InvalidArgumentError

log = logging.getLogger("torchlower")


def eval_view(model: nn.Module) -> nn.Module:
    """The model in eval mode without touching the caller's: a shallow copy when training."""
    if not any(m.training for m in model.modules()):
        return model
    log.warning("%s is in training mode; exporting an eval-mode copy", type(model).__name__)
    view = copy.deepcopy(model)
    return view.eval()


def as_tuple(args: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """Validated by ``validate.args_argument``: a tensor or a non-empty sequence of tensors."""
    return (args,) if isinstance(args, torch.Tensor) else tuple(args)


def input_names(model: nn.Module, example: Sequence[torch.Tensor], names: Sequence[str] | None) -> list[str]:
    if names is not None:
        if len(names) != len(example):
            raise InvalidArgumentError(f"{len(names)} input names for {len(example)} inputs")
        return list(names)
    try:
        params = list(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        params = []
    if len(params) >= len(example) and all(p.isidentifier() for p in params[: len(example)]):
        return params[: len(example)]
    star = varargs_name(model)
    if star is not None and params and params[-1] == star and len(params) - 1 <= len(example):
        fixed = params[:-1]  # forward(self, a, *xs): a, xs_0, xs_1 (as the FX front end names them)
        return fixed + [f"{star}_{i}" for i in range(len(example) - len(fixed))]
    return [f"input_{i}" for i in range(len(example))]


def varargs_name(model: nn.Module) -> str | None:
    try:
        found = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return None
    return next((p.name for p in found if p.kind is p.VAR_POSITIONAL), None)


def output_names(
    expected: Sequence[torch.Tensor], names: Sequence[str] | None, returned: Any = None
) -> list[str]:
    if names is not None:
        if len(names) != len(expected):
            raise InvalidArgumentError(f"{len(names)} output names for {len(expected)} outputs")
        return list(names)
    keyed = key_names(returned)
    if keyed is not None and len(keyed) == len(expected):
        return keyed
    return [f"output_{i}" for i in range(len(expected))] if len(expected) > 1 else ["output"]


def key_names(returned: Any) -> list[str] | None:
    """Outputs of a dict / dataclass / Hugging Face ``ModelOutput`` named by their keys, nested
    keys joined with ``.`` (``last_hidden_state``, ``extra.probs``, ``past.0``); None when the
    output holds no keys (plain tensors and tuples keep ``output_0``…)."""
    from torch.utils import _pytree as pytree

    leaves = pytree.tree_flatten_with_path(returned)[0]
    keyed = (pytree.MappingKey, pytree.GetAttrKey)
    if not any(isinstance(k, keyed) for path, _ in leaves for k in path):
        return None
    parts = {
        pytree.MappingKey: lambda k: str(k.key),
        pytree.GetAttrKey: lambda k: k.name,
        pytree.SequenceKey: lambda k: str(k.idx),
    }
    names = [".".join(parts.get(type(k), str)(k) for k in path) for path, _ in leaves]
    valid = all(re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.]*", n) for n in names)
    return names if valid and len(set(names)) == len(names) else None


def flatten_outputs(out: Any) -> list[torch.Tensor]:
    leaves, _ = torch.utils._pytree.tree_flatten(out)
    bad = [type(x).__name__ for x in leaves if not isinstance(x, torch.Tensor)]
    if bad:
        found = sorted(set(bad))
        fix = "return tensors, or tuples / lists / dicts of tensors"
        if any(name.endswith("Cache") for name in found):  # transformers' DynamicCache & co.
            fix = (
                "the model returns its KV cache object: build it with use_cache=False"
                " (model.config.use_cache = False), or export a causal LM with its cache as tensors"
                " through torchlower.llm.export (docs/llm.md)"
            )
        raise InvalidArgumentError(f"model outputs must be tensors; found {', '.join(found)}: {fix}")
    return leaves


_REGISTRIES = {"_parameters", "_buffers", "_modules"}


@contextlib.contextmanager
def state_kept(model: nn.Module) -> Iterator[None]:
    """Run ``model`` without leaving what its forward caches on itself (ultralytics' Detect keeps
    the last input shape and its anchors, rotary layers the last table): every plain attribute
    of every submodule is put back, and new ones removed, when the block ends.

    Why: the eager runs before tracing (the example, the check sizes, the probes) would
    otherwise leave a cache sized by the last of them, and the trace would compare a symbolic
    size with it (torch.export then pins the batch to that size). Parameters, buffers and
    submodules are not touched, nor modules whose class changed (a lazy module materialized).
    """
    saved = [
        (m, type(m), {k: v for k, v in vars(m).items() if k not in _REGISTRIES}) for m in model.modules()
    ]
    try:
        yield
    finally:
        for m, cls, attrs in saved:
            if type(m) is not cls:
                continue
            for key in [k for k in vars(m) if k not in _REGISTRIES and k not in attrs]:
                delattr(m, key)
            for key, value in attrs.items():
                if vars(m).get(key) is not value:
                    object.__setattr__(m, key, value)

"""LoRA adapters (a ``peft`` ``save_pretrained`` folder) applied to the base model before tracing.

Read without ``peft``: ``adapter_config.json`` and ``adapter_model.safetensors`` hold all a plain
LoRA needs (per target ``nn.Linear``: ``A`` [r, in], ``B`` [out, r], and the scale
``lora_alpha / r``, or ``/ sqrt(r)`` with ``use_rslora``, per module through ``rank_pattern`` /
``alpha_pattern`` as peft resolves them). Two ways into the graph:

- merged: each target's weight becomes ``W + scale · B @ A`` (computed in f64, stored as the
  base's own tensor, so the archive is an ordinary one of the same shapes);
- separate: each target computes ``x @ Wᵀ + (x @ Aᵀ) @ (scale · B)ᵀ``, with ``A`` and the
  scaled ``B`` stored as their own tensors (``<module>.lora_A``, ``<module>.lora_B``) next to
  the base weights, so another adapter of the same rank and targets is a swap of those files.

Options that change the computation in ways this does not reproduce (DoRA, LoRA biases,
extra trained modules, …) are refused with ``AdapterError`` naming the option, as is an
adapter whose modules or shapes are not the base's.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from torchlower.errors import InvalidArgumentError
from torchlower.llm.source import SourceError

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
_PREFIX = "base_model.model."
_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<part>A|B)\.weight$")
# config fields that must be off / empty: each changes what the adapted layer computes
_REFUSED_FIELDS = {
    "use_dora": "DoRA (a learned magnitude per output column)",
    "lora_bias": "a bias on lora_B",
    "fan_in_fan_out": "transposed (Conv1D) base weights",
    "modules_to_save": "fully trained extra modules",
    "trainable_token_indices": "trained embedding rows",
    "layer_replication": "replicated layers",
    "target_parameters": "LoRA on bare parameters (expert weights)",
    "alora_invocation_tokens": "activated LoRA (applied after an invocation token)",
    "use_qalora": "QA-LoRA (pooled inputs)",
    "megatron_config": "Megatron parallel layers",
    "arrow_config": "Arrow routing between adapters",
    "use_bdlora": "block-diagonal LoRA",
    "kasa_config": "KaSA (singular-value adaptation)",
    "velora_config": "VeLoRA",
    "monteclora_config": "MonteCLoRA (sampled adapters)",
}
# initialisations that rewrite the base weights: the adapter only holds with that rewritten base
_BASE_REWRITING_INITS = ("pissa", "olora", "corda", "loftq", "lora_ga")


class AdapterError(SourceError):
    """The LoRA adapter cannot be applied as exported: an unsupported peft option, or an adapter
    trained on another base model (modules or shapes that are not the base's)."""

    def __init__(self, message: str, *, option: str | None = None) -> None:
        super().__init__(message)
        self.option = option  # the adapter_config.json field (or tensor) refused


@dataclass(frozen=True)
class Pair:
    """One adapted ``nn.Linear``: ``A`` [r, in], ``B`` [out, r] and peft's scale."""

    module: str  # the module's path in the causal LM (``model.layers.0.self_attn.q_proj``)
    a: torch.Tensor
    b: torch.Tensor
    scale: float

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])


@dataclass(frozen=True)
class Adapter:
    """A LoRA adapter read from its folder."""

    folder: Path
    pairs: tuple[Pair, ...]
    config_bytes: bytes  # adapter_config.json as found (bundled with separate adapters)


def read_adapter(folder: str | os.PathLike[str]) -> Adapter:
    """The adapter of a peft ``save_pretrained`` folder, refused typed when not a plain LoRA."""
    path = Path(folder)
    config_path = path / CONFIG_FILE
    if not config_path.is_file():
        raise AdapterError(
            f"{config_path}: missing; a LoRA adapter folder holds adapter_config.json and "
            "adapter_model.safetensors (peft's model.save_pretrained(folder) writes both)"
        )
    raw = config_path.read_bytes()
    try:
        config = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterError(f"{config_path}: not readable JSON ({exc})") from exc
    if not isinstance(config, dict):
        raise AdapterError(f"{config_path}: not a peft adapter config (a JSON object)")
    _refuse_options(config_path, config)
    tensors = _read_weights(path)
    pairs = _pairs(path, config, tensors)
    return Adapter(path, pairs, raw)


def _refuse_options(where: Path, config: dict[str, Any]) -> None:
    kind = config.get("peft_type")
    if kind != "LORA":
        raise AdapterError(
            f"{where}: peft_type {kind!r} is not supported; torchlower applies LoRA adapters "
            "(peft_type 'LORA'). Merge the adapter in peft (merge_and_unload) and export that folder",
            option="peft_type",
        )
    for option, what in _REFUSED_FIELDS.items():
        value = config.get(option)
        if value not in (None, False, [], {}, ""):
            raise AdapterError(
                f"{where}: {option}={value!r} ({what}) is not supported by torchlower's LoRA export; "
                "merge the adapter in peft (model.merge_and_unload()) and export the merged folder",
                option=option,
            )
    if config.get("bias", "none") != "none":
        raise AdapterError(
            f"{where}: bias={config['bias']!r} (trained base biases) is not supported; merge the "
            "adapter in peft (model.merge_and_unload()) and export the merged folder",
            option="bias",
        )
    init = config.get("init_lora_weights")
    if isinstance(init, str) and init.lower().startswith(_BASE_REWRITING_INITS):
        raise AdapterError(
            f"{where}: init_lora_weights={init!r} rewrites the base weights, so this adapter only "
            "holds with that rewritten base; convert it to a plain LoRA when saving (peft's "
            "path_initial_model_for_weight_conversion) or export the merged model",
            option="init_lora_weights",
        )


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(path))
            return torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as exc:
            raise AdapterError(f"{path}: not a readable adapter checkpoint ({exc})") from exc
    raise AdapterError(f"{folder}: no adapter_model.safetensors (or adapter_model.bin)")


def _pairs(folder: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> tuple[Pair, ...]:
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key.removeprefix(_PREFIX))
        if match is None:
            raise AdapterError(
                f"{folder}: tensor {key} is not a LoRA A/B matrix (embedding LoRA, DoRA magnitudes "
                "and trained extra modules are not supported)",
                option=key,
            )
        parts.setdefault(match["module"], {})[match["part"]] = tensor.detach().to(torch.float32)
    if not parts:
        raise AdapterError(f"{folder}: the adapter holds no LoRA matrices")
    rslora = bool(config.get("use_rslora"))
    pairs = []
    for module in sorted(parts):
        found = parts[module]
        if set(found) != {"A", "B"} or found["A"].dim() != 2 or found["B"].dim() != 2:
            raise AdapterError(f"{folder}: {module} needs one 2-D lora_A and one 2-D lora_B", option=module)
        a, b = found["A"], found["B"]
        rank = _pattern(config.get("rank_pattern"), module, config.get("r", 8))
        alpha = _pattern(config.get("alpha_pattern"), module, config.get("lora_alpha", 8))
        if a.shape[0] != rank or b.shape[1] != rank:
            raise AdapterError(
                f"{folder}: {module} has lora_A {tuple(a.shape)} and lora_B {tuple(b.shape)} but "
                f"adapter_config.json gives it rank {rank}",
                option="r",
            )
        scale = alpha / math.sqrt(rank) if rslora else alpha / rank
        pairs.append(Pair(module, a, b, float(scale)))
    return tuple(pairs)


def _pattern(patterns: Any, module: str, default: Any) -> float:
    """peft's ``get_pattern_key``: the first pattern that matches the module path's tail."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return value
    return default


def check_base(adapter: Adapter, model: nn.Module) -> None:
    """``AdapterError`` unless every adapted module is an ``nn.Linear`` of the base with the
    adapter's shapes (an adapter trained on another base)."""
    modules = dict(model.named_modules())
    for pair in adapter.pairs:
        target = modules.get(pair.module)
        if target is None:
            raise AdapterError(
                f"{adapter.folder}: adapts {pair.module}, which the base model "
                f"({type(model).__name__}) does not have: an adapter trained on another base model",
                option="base",
            )
        if not isinstance(target, nn.Linear):
            raise AdapterError(
                f"{adapter.folder}: adapts {pair.module}, a {type(target).__name__}; torchlower "
                "applies LoRA to nn.Linear layers only",
                option=pair.module,
            )
        want = (target.out_features, target.in_features)
        got = (int(pair.b.shape[0]), int(pair.a.shape[1]))
        if got != want:
            raise AdapterError(
                f"{adapter.folder}: {pair.module} is a [{want[0]}, {want[1]}] linear layer in the base "
                f"but the adapter's B @ A is [{got[0]}, {got[1]}]: an adapter trained on another base model",
                option="base",
            )


class LoraLinear(nn.Module):
    """``x @ Wᵀ + b + (x @ Aᵀ) @ Bᵀ`` with ``B`` already scaled; ``weight``/``bias`` are the
    base layer's own parameters, so their labels (and a Q4_0 packing) stay the base's."""

    def __init__(self, base: nn.Linear, a: torch.Tensor, b_scaled: torch.Tensor) -> None:
        super().__init__()
        self.weight = base.weight
        self.bias = base.bias
        self.lora_A = nn.Parameter(a.to(base.weight.dtype), requires_grad=False)
        self.lora_B = nn.Parameter(b_scaled.to(base.weight.dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias) + F.linear(F.linear(x, self.lora_A), self.lora_B)


def merged_linear(base: nn.Linear, pair: Pair) -> nn.Linear:
    """A new ``nn.Linear`` holding ``W + scale · B @ A`` (the base layer is left as it was)."""
    delta = pair.scale * (pair.b.double() @ pair.a.double())
    layer = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None, device="meta")
    layer.weight = nn.Parameter((base.weight.double() + delta).to(base.weight.dtype), requires_grad=False)
    layer.bias = base.bias
    return layer


def from_option(source: Any, lora: str | os.PathLike[str] | None, merge_lora: bool) -> Adapter | None:
    """``export``'s ``lora=`` / ``merge_lora=`` validated, the adapter read (None without one)."""
    if hasattr(source, "peft_config") and isinstance(source, nn.Module):
        raise InvalidArgumentError(
            f"source is a peft {type(source).__name__}; pass its base model (folder or model) with "
            "lora= the adapter folder (peft's save_pretrained), or export model.merge_and_unload()"
        )
    if not isinstance(merge_lora, bool):
        raise InvalidArgumentError(f"merge_lora must be True or False, got {merge_lora!r}")
    if lora is None:
        if merge_lora:
            raise InvalidArgumentError("merge_lora=True needs lora= (a peft LoRA adapter folder)")
        return None
    if not isinstance(lora, (str, os.PathLike)):
        raise InvalidArgumentError(f"lora must be an adapter folder path, got {type(lora).__name__}")
    return read_adapter(lora)


@contextmanager
def applied(model: nn.Module, adapter: Adapter | None, merge: bool) -> Iterator[None]:
    """The adapter in ``model`` (restored after: the caller's model is not changed); nothing
    without one."""
    if adapter is None:
        yield
        return
    check_base(adapter, model)
    swapped: list[tuple[nn.Module, str, nn.Module]] = []
    try:
        for pair in adapter.pairs:
            parent_name, _, leaf = pair.module.rpartition(".")
            parent = model.get_submodule(parent_name)
            base = getattr(parent, leaf)
            new = merged_linear(base, pair) if merge else LoraLinear(base, pair.a, pair.scale * pair.b)
            swapped.append((parent, leaf, base))
            setattr(parent, leaf, new)
        yield
    finally:
        for parent, leaf, base in reversed(swapped):
            setattr(parent, leaf, base)


def adapter_labels(wrapper: nn.Module) -> set[str]:
    """Parameter names (graph labels) of the separate LoRA matrices in the traced wrapper."""
    return {
        f"{name}.{attr}"
        for name, m in wrapper.named_modules()
        if isinstance(m, LoraLinear)
        for attr in ("lora_A", "lora_B")
    }


def properties(adapter: Adapter, merge: bool) -> dict[str, str | int | float]:
    """The ``torchlower.llm.lora*`` properties of the archive."""
    ranks = sorted({p.rank for p in adapter.pairs})
    return {
        "torchlower.llm.lora": "merged" if merge else "separate",
        "torchlower.llm.lora_modules": len(adapter.pairs),
        "torchlower.llm.lora_rank": ",".join(map(str, ranks)),
    }

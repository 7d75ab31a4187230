"""State-space and hybrid causal LMs (Mamba, Mamba2, Bamba, Falcon-H1, …) as
``(input_ids, *states) -> (logits, *new)``.

A state-space layer carries two fixed-size states between calls instead of a growing KV cache:
the last ``conv_kernel`` inputs of its causal depthwise convolution (``conv``, [1, channels, K])
and the SSM state (``ssm``, Mamba [1, channels, N], Mamba2 [1, heads, head_dim, N]). tract's
``detect_kv_cache`` only turns ``input → concat along a growing axis → output`` into state, so
these are explicit graph I/O, ``in_conv_state_{i}`` / ``in_ssm_state_{i}`` →
``out_conv_state_{i}`` / ``out_ssm_state_{i}`` (zeros before the first call). A hybrid's
attention layers keep the KV cache of ``wrapper.py`` (``in_cache_key_{i}`` …, [1, kv_heads, P,
head_dim]), in layer order with the states. One graph takes any S ≥ 1 tokens from any state.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torchlower.llm.ssm_mixers import MIXERS, Mixed

KV_KINDS = ("key", "value")


@dataclass(frozen=True)
class StateLayout:
    """Every layer's states (``conv``, ``ssm``) or KV cache (``key``, ``value``; axis 2 grows),
    in input order, read from HF's own cache after a 2-token prefill."""

    layers: int
    shapes: tuple[tuple[int, ...], ...]  # key/value with past 0
    kinds: tuple[str, ...]
    indices: tuple[int, ...]  # the model layer each entry belongs to

    @property
    def has_kv(self) -> bool:
        return any(k in KV_KINDS for k in self.kinds)

    def names(self, io: str) -> list[str]:
        return [
            f"{io}_cache_{k}_{i}" if k in KV_KINDS else f"{io}_{k}_state_{i}"
            for k, i in zip(self.kinds, self.indices, strict=True)
        ]

    def state_names(self, io: str) -> list[str]:
        """The fixed-size states only (what stays explicit I/O)."""
        return [n for n, k in zip(self.names(io), self.kinds, strict=True) if k not in KV_KINDS]

    def input_names(self, logits: str = "last") -> list[str]:
        """``input_ids`` then the states (``logits="keep"`` is refused for these models)."""
        return ["input_ids", *self.names("in")]

    def output_names(self) -> list[str]:
        return ["outputs", *self.names("out")]

    def empty(self, past: int = 0, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
        """Zero states, and KV caches of ``past`` positions."""
        out = []
        for shape, kind in zip(self.shapes, self.kinds, strict=True):
            grown = (*shape[:2], past, *shape[3:]) if kind in KV_KINDS else shape
            out.append(torch.zeros(grown, dtype=dtype))
        return out

    def axes(self, context: int) -> dict[str, dict[int, tuple[str, int, int]]]:
        kv = [n for n, k in zip(self.names("in"), self.kinds, strict=True) if k in KV_KINDS]
        return {"input_ids": {1: ("S", 1, context)}} | {n: {2: ("P", 1, context)} for n in kv}


def is_state_space(model: nn.Module) -> bool:
    return any(type(m).__name__ in MIXERS for m in model.modules())


def hf_forward(
    model: nn.Module, input_ids: torch.Tensor, past: Any = None, start: int = 0, call: Any = None
) -> Any:
    """The model as HF's ``generate`` runs it: its own cache built from the config (per layer
    conv and recurrent states, or keys and values), prefill on the first call, updates after,
    and positions from ``start`` (Bamba's forward counts from 0 when it is given none).
    ``call`` runs the model instead of ``model(...)`` (the check's dequantized weights)."""
    from transformers.cache_utils import DynamicCache

    from torchlower.llm.wrapper import cache_arg

    options = {cache_arg(model): past if past is not None else DynamicCache(config=model.config)}
    if "position_ids" in inspect.signature(model.forward).parameters:
        options["position_ids"] = torch.arange(start, start + input_ids.shape[1])[None]
    with torch.no_grad():
        return (call or model)(input_ids=input_ids, use_cache=True, **options)


def _entries(layer: Any) -> list[tuple[str, torch.Tensor]]:
    """A cache layer's tensors: a mixer's states, an attention layer's keys and values, or both
    (Falcon-H1's layers run attention and a Mamba2 mixer side by side)."""
    states = (
        [("conv", layer.conv_states[0]), ("ssm", layer.recurrent_states[0])]
        if hasattr(layer, "conv_states")
        else []
    )
    kv = [("key", layer.keys), ("value", layer.values)] if getattr(layer, "keys", None) is not None else []
    return [*states, *kv]


def hf_states(cache: Any) -> list[torch.Tensor]:
    """HF's cache flattened as the graph orders it (per layer conv, ssm or key, value)."""
    return [t.detach().clone() for layer in cache.layers for _, t in _entries(layer)]


def state_layout(model: nn.Module) -> StateLayout:
    from torchlower.llm.wrapper import present_cache

    cache = present_cache(hf_forward(model, torch.zeros(1, 2, dtype=torch.long)))
    shapes, kinds, indices = [], [], []
    for i, layer in enumerate(cache.layers):
        for kind, t in _entries(layer):
            shape = tuple(t.shape)
            shapes.append((*shape[:2], 0, *shape[3:]) if kind in KV_KINDS else shape)
            kinds.append(kind)
            indices.append(i)
    return StateLayout(len(cache.layers), tuple(shapes), tuple(kinds), tuple(indices))


class StatefulCausalLM(nn.Module):
    """``forward(input_ids, *states)`` → ``(logits, *new_states)`` around a state-space LM."""

    def __init__(
        self,
        model: nn.Module,
        layout: StateLayout,
        logits: str = "last",
        state_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.model = model
        self.layout = layout
        self.last_only = logits == "last"
        self.state_dtype = state_dtype
        self.model_type = str(model.config.model_type)
        # the mask has no empty row (last_row.drop_last_guard applies) when there is attention
        self.own_mask = not layout.has_kv

    def forward(self, input_ids: torch.Tensor, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        layout = self.layout
        slots = list(zip(layout.kinds, layout.indices, strict=True))
        feed = dict(zip(slots, inputs, strict=True))
        new: dict[tuple[str, int], torch.Tensor] = {}
        options: dict[str, Any] = {"logits_to_keep": 1 if self.last_only else 0, "use_cache": False}
        cache = None
        if layout.has_kv:
            cache, options = self._attention_options(input_ids, feed, options)
        with _mixers_on(self.model, feed, new):
            out = self.model(input_ids=input_ids, **options)
        for i, layer in enumerate(cache.layers if cache is not None else ()):
            if ("key", i) in feed:
                new[("key", i)], new[("value", i)] = layer.keys, layer.values
        return (out.logits, *(new[s].to(self.state_dtype) for s in slots))

    def _attention_options(
        self, input_ids: torch.Tensor, feed: dict[tuple[str, int], torch.Tensor], options: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        """A cache holding the attention layers' past (the others empty), positions and mask."""
        from transformers.cache_utils import DynamicCache, DynamicLayer

        from torchlower.llm.wrapper import additive_mask, cache_arg

        layers = []
        for i in range(self.layout.layers):
            layer = DynamicLayer()
            if ("key", i) in feed:
                layer.keys = feed[("key", i)].to(self.model.dtype)
                layer.values = feed[("value", i)].to(self.model.dtype)
                layer.device, layer.is_initialized = layer.keys.device, True
            layers.append(layer)
        cache = DynamicCache()
        cache.layers = layers
        past = next(t for (k, _), t in feed.items() if k == "key").shape[2]
        query = torch.arange(past, past + input_ids.shape[1], device=input_ids.device)
        key = torch.arange(0, past + input_ids.shape[1], device=input_ids.device)
        mask = additive_mask(key[None, :] <= query[:, None], self.model.dtype)
        masks = {"full_attention": mask, "linear_attention": None}
        options = options | {cache_arg(self.model): cache, "use_cache": True, "attention_mask": masks}
        return cache, options | {"position_ids": query.unsqueeze(0)}


@contextmanager
def _mixers_on(
    model: nn.Module, feed: dict[tuple[str, int], torch.Tensor], new: dict[tuple[str, int], torch.Tensor]
) -> Iterator[None]:
    """Each mixer reads its layer's states from ``feed`` and writes the new ones to ``new``
    (its ``forward`` restored after)."""
    patched = []
    for module in model.modules():
        fn = MIXERS.get(type(module).__name__)
        if fn is not None:
            patched.append(module)
            module.forward = types.MethodType(_forward(fn, feed, new, module.layer_idx), module)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for module in patched:
            del module.forward


def _forward(
    fn: Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], Mixed],
    feed: dict[tuple[str, int], torch.Tensor],
    new: dict[tuple[str, int], torch.Tensor],
    layer: int,
) -> Callable[..., torch.Tensor]:
    def forward(self: nn.Module, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        out, new[("conv", layer)], new[("ssm", layer)] = fn(
            self, hidden_states, feed[("conv", layer)], feed[("ssm", layer)]
        )
        return out

    return forward

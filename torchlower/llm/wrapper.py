"""A Hugging Face causal LM as a function of plain tensors: ``(input_ids, *past) -> (logits, *present)``.

The graph tract's ``detect_kv_cache`` transform recognizes (transformers/src/ops/dyn_kv_cache.rs,
``replace_kv_cache``): each cache input feeds exactly one ``concat`` with the new keys/values
along a symbolic axis, and that concat *is* a graph output. The names follow the convention of
tract's causal-LM runner and the reference exporter: ``input_ids`` [1, S], then per layer
``in_cache_key_{i}`` / ``in_cache_value_{i}`` [1, kv_heads, P, head_dim]; outputs ``outputs``
(logits) then ``out_cache_key_{i}`` / ``out_cache_value_{i}`` [1, kv_heads, P+S, head_dim].
The runner takes input 0 as tokens and the remaining inputs/outputs as caches in order.

The wrapper owns positions and the attention mask (from ``arange(P, P+S)`` and
``arange(P+S)``), so they stay symbolic in P and S and P = 0 (prefill) works; the model's own
mask code is used only where the architecture derives more than the mask from it (ALiBi).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from torchlower.errors import LoweringError


def mask_from_model(config: Any) -> bool:
    """ALiBi models build their position bias from the 2-D mask: let the model build both."""
    return config.model_type == "bloom" or (config.model_type == "falcon" and bool(config.alibi))


# with ``logits="keep"``: the last graph input, i64 [K], the indices among the S new positions
# whose logits the graph returns (HF's ``logits_to_keep`` given as a tensor); last K: S-K..S-1
KEEP_INPUT = "logits_to_keep"


@dataclass(frozen=True)
class CacheLayout:
    """Shape of one layer's key/value cache, ``[1, heads, P, head_dim]`` (read from a real run)."""

    layers: int
    key_heads: int
    key_dim: int
    value_heads: int
    value_dim: int

    def input_names(self, logits: str = "last") -> list[str]:
        """``input_ids``, the caches, then with ``logits="keep"`` the positions to keep."""
        caches = [f"in_cache_{t}_{i}" for i in range(self.layers) for t in ("key", "value")]
        return ["input_ids", *caches, *([KEEP_INPUT] if logits == "keep" else [])]

    def output_names(self) -> list[str]:
        return ["outputs"] + [f"out_cache_{t}_{i}" for i in range(self.layers) for t in ("key", "value")]

    def empty(self, past: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
        out = []
        for _ in range(self.layers):
            out.append(torch.zeros(1, self.key_heads, past, self.key_dim, dtype=dtype))
            out.append(torch.zeros(1, self.value_heads, past, self.value_dim, dtype=dtype))
        return out


def cache_arg(model: nn.Module) -> str:
    """The keyword the model's ``forward`` takes its cache by (``cache`` in transformers ≥ 5.2x)."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def hf_forward(model: nn.Module, input_ids: torch.Tensor, past: Any = None) -> Any:
    """The model as HF runs it (its own mask and positions): the reference of every check.

    The cache starts as a plain ``DynamicCache`` (never cropped), like the archive's: with a
    sliding window HF's own mask code still applies the window.
    """
    from transformers.cache_utils import DynamicCache

    with torch.no_grad():
        return model(input_ids=input_ids, use_cache=True, **{cache_arg(model): past or DynamicCache()})


def present_cache(out: Any) -> Any:
    """The cache a model call returned (``cache`` in transformers >= 5.2x, else ``past_key_values``)."""
    cache = out.get("cache") if hasattr(out, "get") else None
    return cache if cache is not None else out.past_key_values


def cache_tensors(cache: Any) -> list[torch.Tensor]:
    """Flat ``[k0, v0, k1, v1, ...]`` of a transformers cache object."""
    out: list[torch.Tensor] = []
    for layer in cache.layers:
        out += [layer.keys, layer.values]
    return out


def layout_of(model: nn.Module) -> CacheLayout:
    """The cache layout, read from the model's own cache after one 2-token step."""
    out = _shape_run(model)
    try:
        tensors = cache_tensors(present_cache(out))
    except (AttributeError, TypeError) as exc:
        raise LoweringError(
            f"{type(model).__name__} keeps no key/value cache torchlower.llm can expose ({exc}); "
            "only attention KV caches are supported"
        ) from exc
    keys, values = tensors[0::2], tensors[1::2]
    shapes = {(tuple(k.shape), tuple(v.shape)) for k, v in zip(keys, values, strict=True)}
    name = type(model).__name__
    if len(shapes) != 1:
        raise LoweringError(
            f"{name}: layers with different cache shapes ({sorted(shapes)}) are not supported"
        )
    ((k, v),) = shapes
    if len(k) != 4 or k[0] != 1 or k[2] != 2 or v[2] != 2:
        raise LoweringError(f"{name}: cache layout {k} is not [batch, heads, seq, head_dim]")
    return CacheLayout(len(keys), k[1], k[3], v[1], v[3])


@contextmanager
def attributes_kept(model: nn.Module) -> Iterator[None]:
    """Every plain tensor attribute and every buffer's values as they were before (restored after).

    transformers caches tensors on modules as a side effect of ``forward`` (longrope's
    ``long_inv_freq``, built on the device of the call) and rewrites buffers in place (its
    ``inv_freq``): a ``meta`` shape run or a trace would leave a meta or fake tensor on the
    caller's model, which later traces read, and the check's calls would change its buffers.
    """
    saved = [(m, {k: v for k, v in vars(m).items() if isinstance(v, torch.Tensor)}) for m in model.modules()]
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    try:
        yield
    finally:
        for module, tensors in saved:
            for name in [k for k, v in vars(module).items() if isinstance(v, torch.Tensor)]:
                if name not in tensors:
                    delattr(module, name)
            for name, value in tensors.items():
                setattr(module, name, value)
        with torch.no_grad():
            for buffer, value in buffers:
                buffer.copy_(value)


def _shape_run(model: nn.Module) -> Any:
    """A 2-token forward for the cache shapes, on ``meta`` copies of the weights when possible.

    Shapes are all it needs, so no weight is read (a memory-mapped checkpoint stays on disk);
    a model whose code cannot run on ``meta`` runs for real.
    """
    from transformers.cache_utils import DynamicCache

    state = {k: v.to("meta") for k, v in [*model.named_parameters(), *model.named_buffers()]}
    ids = torch.zeros(1, 2, dtype=torch.long, device="meta")
    try:
        with torch.no_grad(), attributes_kept(model):
            options = {"input_ids": ids, "use_cache": True, cache_arg(model): DynamicCache()}
            return torch.func.functional_call(model, state, (), options, tie_weights=False)
    except Exception:  # any failure on meta: measure with the real weights
        device = next(model.parameters()).device
        return hf_forward(model, torch.zeros(1, 2, dtype=torch.long, device=device))


def dynamic_cache(tensors: tuple[torch.Tensor, ...]) -> Any:
    """A ``DynamicCache`` holding the given tensors as they are: its update is one ``cat``.

    Built layer by layer (not from the config) so sliding-window layers never crop: tract's
    cache grows to P+S and the window is applied by the mask.
    """
    from transformers.cache_utils import DynamicCache, DynamicLayer

    layers = []
    for i in range(0, len(tensors), 2):
        layer = DynamicLayer()
        layer.keys, layer.values = tensors[i], tensors[i + 1]
        layer.device, layer.is_initialized = tensors[i].device, True
        layers.append(layer)
    cache = DynamicCache()
    cache.layers = layers
    return cache


class CachedCausalLM(nn.Module):
    """``forward(input_ids, *past)`` → ``(logits, *present)`` around a transformers causal LM."""

    def __init__(
        self,
        model: nn.Module,
        layout: CacheLayout,
        logits: str = "last",
        cache_dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.cache_dtype = cache_dtype
        self.model = model
        self.layout = layout
        self.last_only = logits == "last"
        self.keep_input = logits == "keep"  # positions to keep: the graph's last input
        config = model.config.get_text_config(decoder=True)
        self.model_type = str(model.config.model_type)
        self.window = _sliding_window(config)
        self.layer_types = list(getattr(config, "layer_types", None) or [])
        self.cache_arg = cache_arg(model)
        params = inspect.signature(model.forward).parameters
        self.keep = "logits_to_keep" in params
        self.positions = "position_ids" in params
        self.own_mask = mask_from_model(model.config)

    feed = "input_ids"  # the keyword the first graph input goes to (``inputs_embeds``: EmbedsCausalLM)

    def forward(self, input_ids: torch.Tensor, *past: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return self.step(input_ids, None, past)

    def step(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor | None,
        past: tuple[torch.Tensor, ...],
        blocks: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        """One call of the model; ``positions`` given (M-RoPE's [3, 1, S]) or ``arange(P, P+S)``;
        ``blocks`` [1, S]: the new tokens' image-block ids (``BlockCausalLM``)."""
        keep = past[-1] if self.keep_input else None
        past = past[:-1] if self.keep_input else past
        p, s = past[0].shape[2], input_ids.shape[1]
        cache = dynamic_cache(tuple(t.to(self.model.dtype) for t in past))
        query = torch.arange(p, p + s, device=input_ids.device)
        options: dict[str, Any] = {self.cache_arg: cache, "use_cache": True}
        if not self.own_mask:
            options["attention_mask"] = self._mask(query, p + s, blocks)
        if self.positions:
            options["position_ids"] = query.unsqueeze(0) if positions is None else positions
        if self.keep:
            options["logits_to_keep"] = 1 if self.last_only else keep if keep is not None else 0
        out = self.model(**{self.feed: input_ids}, **options)
        logits = out.logits
        if keep is not None and not self.keep:
            logits = logits.index_select(1, keep)
        if self.last_only and logits.shape[1] != 1:
            logits = logits[:, -1:, :]
        return (logits, *(t.to(self.cache_dtype) for t in cache_tensors(present_cache(out))))

    def _mask(self, query: torch.Tensor, total: Any, blocks: torch.Tensor | None = None) -> Any:
        """Additive float masks [1, 1, S, P+S]: causal, and causal within the sliding window;
        with ``blocks``, a new token also sees the later new tokens of its own nonzero block
        (the window still applies, as HF's ``create_masks_for_vision_model`` composes them)."""
        key = torch.arange(0, total, device=query.device)
        causal = key[None, :] <= query[:, None]
        if blocks is not None:  # the past's block ids are 0: always seen causally, never by block
            mine = blocks[0]
            keys = torch.cat([torch.zeros_like(key[: total - mine.shape[0]]), mine])
            causal = causal | ((keys[None, :] == mine[:, None]) & (mine[:, None] != 0))
        dtype = self.model.dtype
        full = additive_mask(causal, dtype)
        if self.window is None:
            return full
        sliding = additive_mask(causal & (key[None, :] > query[:, None] - self.window), dtype)
        if not self.layer_types:
            return sliding
        return {"full_attention": full, "sliding_attention": sliding}


class EmbedsCausalLM(CachedCausalLM):
    """``forward(inputs_embeds, *past)`` → ``(logits, *present)``: the decoder of a multimodal LM,
    fed embeddings so one graph serves text tokens and image/audio features alike."""

    feed = "inputs_embeds"


class MropeCausalLM(EmbedsCausalLM):
    """``forward(inputs_embeds, position_ids, *past)``: Qwen2-VL's decoder, whose multimodal
    rotary positions ([3, 1, S]: time, height, width) are not ``arange`` but come from the
    prompt's layout of text and image tokens (computed by the runner from the manifest)."""

    def forward(
        self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        return self.step(inputs_embeds, position_ids, past)


class BlockCausalLM(EmbedsCausalLM):
    """``forward(inputs_embeds, image_blocks, *past)``: Gemma 3's decoder, whose image tokens see
    each other both ways within one image during prefill (HF's ``token_type_ids`` mask), which
    a causal mask cannot say. ``image_blocks`` [1, S] i64 numbers the new tokens' images (1, 2, …
    per run of image tokens; 0 for text), computed by the runner from the prompt."""

    def forward(
        self, inputs_embeds: torch.Tensor, image_blocks: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        return self.step(inputs_embeds, None, past, image_blocks)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """0 where ``allowed``, the dtype's lowest value elsewhere ([1, 1, …] for the model's layers)."""
    zero = torch.zeros((), dtype=dtype)
    return torch.where(allowed, zero, torch.finfo(dtype).min)[None, None]


def _sliding_window(config: Any) -> int | None:
    """The attention window, when the architecture applies one (``use_sliding_window`` may veto it)."""
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return None
    types = getattr(config, "layer_types", None)
    if types and "sliding_attention" not in types:
        return None
    return int(window)


# Hugging Face's generate for these drops the cache the first time the sequence grows past
# ``original_max_position_embeddings`` and recomputes every position with the long RoPE
# factors (``Phi3ForCausalLM.prepare_inputs_for_generation``): ``llm.generate`` does the same.
RECOMPUTE_AT_ROPE_SWITCH = ("phi3", "phimoe")


def rope_switch_length(config: Any, context: int) -> int | None:
    """The length past which HF's generate recomputes the cache, if it can happen below ``context``."""
    length = getattr(config, "original_max_position_embeddings", None)
    if config.model_type not in RECOMPUTE_AT_ROPE_SWITCH or not isinstance(length, int):
        return None
    return length if length < context else None


def dynamic_rope_limit(model: nn.Module) -> int | None:
    """Positions up to which a dynamic-NTK rotary embedding keeps its original frequencies."""
    limits = [int(m.original_max_seq_len) for m in _dynamic_ropes(model)]
    return min(limits) if limits else None


@contextmanager
def static_rope(model: nn.Module) -> Iterator[None]:
    """Dynamic RoPE traced with its original frequencies (restored after).

    transformers rescales them when a sequence grows beyond ``original_max_seq_len``, a
    data-dependent branch torch.export cannot capture; below that length the original
    frequencies are exactly what it computes, so the export caps ``max_context`` there.
    """
    saved = [(m, m.rope_type, m.inv_freq) for m in _dynamic_ropes(model)]
    try:
        for m, _, _ in saved:
            m.rope_type = "default"
            m.inv_freq = m.original_inv_freq.to(m.inv_freq.device)
        yield
    finally:
        for m, rope_type, inv_freq in saved:
            m.rope_type, m.inv_freq = rope_type, inv_freq


def _dynamic_ropes(model: nn.Module) -> list[nn.Module]:
    return [
        m
        for m in model.modules()
        if isinstance(getattr(m, "rope_type", None), str)
        and "dynamic" in m.rope_type
        and hasattr(m, "original_inv_freq")
    ]


# nn.Linear subclasses whose forward computes exactly ``F.linear`` (``x @ W.T + b``) in a form
# torch.export records as a transpose of the weight: the transpose folds into an unlabelled
# constant, which q4_0 cannot recognize as the layer's weight (nor stream from the checkpoint)
LINEAR_EQUIVALENTS = ("FalconLinear",)


@contextmanager
def plain_linears(model: nn.Module) -> Iterator[None]:
    """Trace those layers through ``nn.Linear.forward`` (restored after): one labelled matmul."""
    patched = [
        m for m in model.modules() if type(m).__name__ in LINEAR_EQUIVALENTS and isinstance(m, nn.Linear)
    ]
    try:
        for m in patched:
            m.forward = nn.Linear.forward.__get__(m)  # type: ignore[method-assign]
        yield
    finally:
        for m in patched:
            del m.forward

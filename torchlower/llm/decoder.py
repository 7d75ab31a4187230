"""An exported LLM decoder loaded in tract, run one step at a time (``runner.generate``,
``vlm_runner``): the KV cache as tract state (``detect_kv_cache``) or explicit tensors. The
fixed-size states of state-space layers (``in_conv_state_{i}``, ``in_ssm_state_{i}``) are always
passed from step to step: in a hybrid (Bamba) the attention caches become tract state and they
stay explicit."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from torchlower.errors import InvalidArgumentError
from torchlower.llm.context import ContextLengthError
from torchlower.llm.manifest import tract_load
from torchlower.llm.wrapper import KEEP_INPUT

KV_MODES = ("auto", "state", "explicit")


class Decoder:
    """An exported LLM loaded in tract, ready to run steps (one per call of ``step``)."""

    def __init__(self, artifact: str | os.PathLike[str], kv: str = "auto") -> None:
        import tract

        if kv not in KV_MODES:
            raise InvalidArgumentError(f"kv must be one of {', '.join(KV_MODES)}; got {kv!r}")
        path = Path(artifact)
        if not path.exists():
            raise InvalidArgumentError(f"{path}: no such artifact")
        nnef = tract.nnef().with_tract_extra().with_tract_transformers()
        model = tract_load(nnef, path)
        self.n_inputs = model.input_count()
        self.feed = model.input_name(0)  # inputs_embeds: a multimodal LM's decoder (vlm_runner.py)
        if self.n_inputs < 3 or self.feed not in ("input_ids", "inputs_embeds"):
            raise InvalidArgumentError(
                f"{path}: not an LLM export (inputs must be input_ids then the caches); "
                "write one with torchlower.llm.export"
            )
        # logits="keep" archives end with the positions to keep (wrapper.KEEP_INPUT)
        self.keeps = model.input_name(self.n_inputs - 1) == KEEP_INPUT
        # inputs before the caches and states: the ids or embeddings, then Qwen2-VL's position_ids
        self.feeds = next(i for i in range(self.n_inputs) if model.input_name(i).startswith("in_"))
        self.cache_facts = [str(model.input_fact(i)) for i in range(self.feeds, self.n_inputs - self.keeps)]
        self.vocab = _vocabulary(str(model.output_fact(0)))
        self.dtypes = [_dtype(f) for f in self.cache_facts]
        self.shapes = [_empty_shape(f) for f in self.cache_facts]
        self.mode = kv
        if kv in ("auto", "state"):
            stateful = tract_load(nnef, path)
            stateful.transform("detect_kv_cache")
            left = [str(stateful.input_fact(i)) for i in self._cache_inputs(stateful)]
            # what stays an input are fixed-size states (state-space layers), passed explicitly
            recognized = stateful.input_count() < self.n_inputs
            if recognized and all(_fixed(f) for f in left):
                model, self.mode = stateful, "state"
            elif kv == "state":
                raise InvalidArgumentError(
                    f"{path}: tract's detect_kv_cache recognized {self.n_inputs - stateful.input_count()} "
                    f"of {len(self.cache_facts)} caches; use kv='explicit'"
                )
            else:
                self.mode = "explicit"
        # the inputs fed from step to step: every cache (explicit), or the fixed-size states
        self.fed_facts = [str(model.input_fact(i)) for i in self._cache_inputs(model)]
        self.recompute_at = _int_property(model, "torchlower.llm.recompute_cache_at")
        self.max_context = _int_property(model, "torchlower.llm.max_context")
        self.path = path
        self.runnable = model.into_runnable()
        self.reset()

    def _cache_inputs(self, model: Any) -> range:
        """Indices of ``model``'s caches and states: after the feeds, before a logits_to_keep input."""
        return range(self.feeds, model.input_count() - self.keeps)

    def reset(self) -> None:
        self.state = self.runnable.spawn_state()
        self.past = [np.zeros(_empty_shape(f), dtype=_dtype(f)) for f in self.fed_facts]
        self.length = 0  # tokens in the cache

    def drops_cache(self, new_tokens: int) -> bool:
        """Whether HF's generate would recompute the cache before these tokens (see ``recompute_at``)."""
        at = self.recompute_at
        return at is not None and 0 < self.length <= at < self.length + new_tokens

    def refuse_past_context(self, needed: int) -> None:
        """``ContextLengthError`` if ``needed`` positions do not fit the archive's bound."""
        if self.max_context is not None and needed > self.max_context:
            raise ContextLengthError(
                f"{self.path}: {needed} positions (prompt and generated tokens fed back) exceed this"
                f" archive's P + S <= {self.max_context}, the model's position limit; keep prompt +"
                f" max_new_tokens - 1 <= {self.max_context}",
                max_context=self.max_context,
                needed=needed,
            )

    def step(self, ids: np.ndarray) -> np.ndarray:
        """Logits of the last position after feeding ``ids`` [1, S] (the cache grows by S)."""
        return self.last_logits(ids, 1)[-1]

    def prefill(self, ids: np.ndarray, chunk: int | None = None) -> np.ndarray:
        """``step`` of ``ids`` [1, S] in calls of at most ``chunk`` tokens (None: one call), the
        caches and states carried from call to call: the same logits and states as one call,
        while each call holds at most ``chunk`` tokens' activations (and stays within a
        state-space archive's ``S <= max_tokens_per_call``)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(1, -1)
        if chunk is None:
            return self.step(ids)
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise InvalidArgumentError(f"prefill_chunk must be an int >= 1 or None; got {chunk!r}")
        for start in range(0, ids.shape[1], chunk):
            logits = self.step(ids[:, start : start + chunk])
        return logits

    def last_logits(self, ids: np.ndarray, keep: int) -> np.ndarray:
        """[keep, vocab]: logits of the last ``keep`` positions after feeding ``ids`` [1, S], e.g.
        to verify draft tokens (a ``logits="keep"`` archive computes only those rows; ``"all"``
        computes every row and this slices)."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(1, -1)
        if isinstance(keep, bool) or not isinstance(keep, int) or not 1 <= keep <= ids.shape[1]:
            raise InvalidArgumentError(
                f"keep must be an int in 1..{ids.shape[1]} (the ids fed); got {keep!r}"
            )
        if self.vocab is not None and ids.size and (ids.min() < 0 or ids.max() >= self.vocab):
            bad = int(ids.min() if ids.min() < 0 else ids.max())
            # tract's Gather panics on an index out of range, which aborts this process
            raise InvalidArgumentError(
                f"token id {bad} is outside the vocabulary of this model (ids 0..{self.vocab - 1}); "
                "encode the prompt with the tokenizer the model was exported with"
            )
        return self._run(ids, (), keep)

    def run(self, feed: np.ndarray, *extra: np.ndarray) -> np.ndarray:
        """Logits of the last position after feeding ``feed`` (ids [1, S] or embeddings [1, S, hidden])
        and the ``extra`` inputs before the caches (Qwen2-VL's position_ids [3, 1, S])."""
        return self._run(feed, extra, 1)[-1]

    def _run(self, feed: np.ndarray, extra: tuple[np.ndarray, ...], keep: int) -> np.ndarray:
        self.refuse_past_context(self.length + feed.shape[1])
        self.length += feed.shape[1]
        rows = [np.arange(feed.shape[1] - keep, feed.shape[1], dtype=np.int64)] if self.keeps else []
        out = self.state.run([feed, *extra, *self.past, *rows])
        self.past = [t.to_numpy() for t in out[1:]]
        logits = out[0].to_numpy()[0]
        return logits[-keep:]


def _int_property(model: Any, key: str) -> int | None:
    """An integer property of the archive (``tract_core_properties``), if it has one."""
    if key not in model.property_keys():
        return None
    return int(model.property(key).to_numpy())


def _vocabulary(fact: str) -> int | None:
    """The logits' last size from tract's fact text (``1,S,32000,f32`` → 32000), if it is a number."""
    parts = fact.split(",")
    return int(parts[-2]) if len(parts) >= 2 and parts[-2].isdigit() else None


def _fixed(fact: str) -> bool:
    """Whether tract's fact text (``1,80,4,f32``) has only numeric dims: a state that does not grow."""
    return all(d.strip().isdigit() for d in fact.split(",")[:-1])


def _dtype(fact: str) -> Any:
    """``1,2,P,8,f32`` (tract's fact text) → numpy dtype."""
    kind = fact.rsplit(",", 1)[-1].strip()
    return {"f32": np.float32, "f16": np.float16}.get(kind, np.float32)


def _empty_shape(fact: str) -> tuple[int, ...]:
    """The cache's shape with the symbolic past axis at 0."""
    dims = [d.strip() for d in fact.split(",")[:-1]]
    return tuple(int(d) if d.lstrip("-").isdigit() else 0 for d in dims)

"""``torchlower.llm.generate``: prefill + decode of an exported LLM in tract, from Python.

Two ways to carry the cache, both what tract's own causal-LM runner does:
- ``kv="state"``: tract's ``detect_kv_cache`` transform turns each cache input/output pair
  into a stateful op, so every step feeds only the new token ids;
- ``kv="explicit"``: the cache tensors go out of one step and into the next.
``"auto"`` uses the state when the transform recognized every cache, else explicit tensors. The
fixed-size states of state-space layers (``in_conv_state_{i}``, ``in_ssm_state_{i}``) are always
passed from step to step: in a hybrid (Bamba) the attention caches become tract state and they
stay explicit.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from torchlower.errors import InvalidArgumentError
from torchlower.llm.context import ContextLengthError

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
        model = nnef.load(str(path))
        self.n_inputs = model.input_count()
        if self.n_inputs < 3 or model.input_name(0) != "input_ids":
            raise InvalidArgumentError(
                f"{path}: not an LLM export (inputs must be input_ids then the caches); "
                "write one with torchlower.llm.export"
            )
        self.cache_facts = [str(model.input_fact(i)) for i in range(1, self.n_inputs)]
        self.vocab = _vocabulary(str(model.output_fact(0)))
        self.dtypes = [_dtype(f) for f in self.cache_facts]
        self.shapes = [_empty_shape(f) for f in self.cache_facts]
        self.mode = kv
        if kv in ("auto", "state"):
            stateful = nnef.load(str(path))
            stateful.transform("detect_kv_cache")
            left = [str(stateful.input_fact(i)) for i in range(1, stateful.input_count())]
            # what stays an input are fixed-size states (state-space layers), passed explicitly
            recognized = stateful.input_count() < self.n_inputs
            if recognized and all(_fixed(f) for f in left):
                model, self.mode = stateful, "state"
            elif kv == "state":
                raise InvalidArgumentError(
                    f"{path}: tract's detect_kv_cache recognized {self.n_inputs - stateful.input_count()} "
                    f"of {self.n_inputs - 1} caches; use kv='explicit'"
                )
            else:
                self.mode = "explicit"
        # the inputs fed from step to step: every cache (explicit), or the fixed-size states
        self.fed_facts = [str(model.input_fact(i)) for i in range(1, model.input_count())]
        self.recompute_at = _int_property(model, "torchlower.llm.recompute_cache_at")
        self.max_context = _int_property(model, "torchlower.llm.max_context")
        self.path = path
        self.runnable = model.into_runnable()
        self.reset()

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
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(1, -1)
        if self.vocab is not None and ids.size and (ids.min() < 0 or ids.max() >= self.vocab):
            bad = int(ids.min() if ids.min() < 0 else ids.max())
            # tract's Gather panics on an index out of range, which aborts this process
            raise InvalidArgumentError(
                f"token id {bad} is outside the vocabulary of this model (ids 0..{self.vocab - 1}); "
                "encode the prompt with the tokenizer the model was exported with"
            )
        self.refuse_past_context(self.length + ids.shape[1])
        self.length += ids.shape[1]
        out = self.state.run([ids, *self.past])
        self.past = [t.to_numpy() for t in out[1:]]
        return out[0].to_numpy()[0, -1]


def generate(
    artifact: str | os.PathLike[str],
    input_ids: Any,
    max_new_tokens: int,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    seed: int | None = None,
    eos_token_id: int | Sequence[int] | None = None,
    kv: str = "auto",
    input_features: Any = None,
) -> list[int]:
    """The new token ids after ``input_ids`` (a list, or a [1, S] array/tensor), run in tract.

    For a speech encoder-decoder export (a folder with ``manifest.json``: Whisper, Speech2Text,
    Moonshine), ``input_ids`` are the decoder's start tokens and ``input_features`` what the
    encoder runs on once (log-mel frames [1, mels, 3000], filter banks [1, T, features], or
    Moonshine's audio samples [1, samples]: the manifest's ``encoder.inputs``); decoding is
    greedy with the generation config's ``suppress_tokens`` / ``begin_suppress_tokens`` applied
    and its end-of-text id as the stop, as HF's Whisper ``generate`` does (timestamps and
    language detection are not done).

    Greedy by default (``do_sample=False``: the arg-max, ties to the lowest id as torch does);
    ``do_sample=True`` samples from softmax(logits / temperature), optionally over the
    ``top_k`` best, with ``seed`` for reproducibility. Stops early at ``eos_token_id``.
    """
    prompt = _as_ids(input_ids)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise InvalidArgumentError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if temperature <= 0:
        raise InvalidArgumentError(f"temperature must be > 0, got {temperature!r}")
    stops = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id or ())
    from torchlower.llm import seq2seq_runner

    if seq2seq_runner.is_seq2seq(Path(artifact)):
        if input_features is None or do_sample:
            raise InvalidArgumentError(
                f"{artifact}: a speech encoder-decoder needs input_features= (log-mel frames) and decodes"
                " greedily (do_sample=False)"
            )
        runner = seq2seq_runner.Seq2SeqRunner(artifact, kv=kv)
        if max_new_tokens:  # the last new token is not fed back
            runner.refuse_past_context(prompt.shape[1] + max_new_tokens - 1)
        if eos_token_id is None:  # HF's default: the generation config's end of text
            stops = set(runner.manifest.get("generation", {}).get("eos_token_id", []))
        return runner.greedy(prompt[0].tolist(), max_new_tokens, input_features, stops, processors=True)[0]
    if input_features is not None:
        raise InvalidArgumentError(f"{artifact}: input_features= is for speech encoder-decoder exports")
    decoder = Decoder(artifact, kv=kv)
    if max_new_tokens:  # the last new token is not fed back
        decoder.refuse_past_context(prompt.shape[1] + max_new_tokens - 1)
    rng = np.random.default_rng(seed)
    tokens: list[int] = []
    feed = prompt
    for _ in range(max_new_tokens):
        if decoder.drops_cache(feed.shape[1]):  # as HF's generate: all positions again, long RoPE
            decoder.reset()
            feed = np.concatenate([prompt, np.array([tokens], dtype=np.int64)], axis=1)
        logits = decoder.step(feed).astype(np.float64)
        token = _pick(logits, do_sample, temperature, top_k, rng)
        tokens.append(token)
        if token in stops:
            break
        feed = np.array([[token]], dtype=np.int64)
    return tokens


def _pick(logits: np.ndarray, sample: bool, temperature: float, top_k: int | None, rng: Any) -> int:
    if not sample:
        return int(np.argmax(logits))
    scores = logits / temperature
    if top_k is not None and 0 < top_k < scores.size:
        cut = np.partition(scores, -top_k)[-top_k]
        scores = np.where(scores >= cut, scores, -np.inf)
    probs = np.exp(scores - scores.max())
    return int(rng.choice(scores.size, p=probs / probs.sum()))


def _as_ids(input_ids: Any) -> np.ndarray:
    try:
        array = np.asarray(input_ids.detach().cpu().numpy() if hasattr(input_ids, "detach") else input_ids)
    except (TypeError, ValueError) as exc:
        raise InvalidArgumentError(f"input_ids must be token ids, got {type(input_ids).__name__}") from exc
    if (
        array.dtype.kind not in "iu"
        or array.size == 0
        or array.ndim > 2
        or (array.ndim == 2 and array.shape[0] != 1)
    ):
        raise InvalidArgumentError(
            f"input_ids must be a non-empty list or [1, S] array of integer ids; got shape {array.shape}, "
            f"dtype {array.dtype}"
        )
    return array.reshape(1, -1).astype(np.int64)


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

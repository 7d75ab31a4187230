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
from torchlower.llm.decoder import Decoder

__all__ = ["ContextLengthError", "Decoder", "generate"]


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
    pixel_values: Any = None,
    feature_attention_mask: Any = None,
    prefill_chunk: int | None = None,
    audio: Any = None,
) -> list[int]:
    """The new token ids after ``input_ids`` (a list, or a [1, S] array/tensor), run in tract.

    For a speech encoder-decoder export (a folder with ``manifest.json``: Whisper, Speech2Text,
    Moonshine), ``input_ids`` are the decoder's start tokens and ``input_features`` what the
    encoder runs on once (log-mel frames [1, mels, 3000], filter banks [1, T, features], or
    Moonshine's audio samples [1, samples]: the manifest's ``encoder.inputs``); decoding is
    greedy with the generation config's ``suppress_tokens`` / ``begin_suppress_tokens`` applied
    and its end-of-text id as the stop, as HF's Whisper ``generate`` does (timestamps and
    language detection are not done). ``audio`` instead: raw samples [n] at 16 kHz, through the
    log-mel front end an ``export(..., frontend=True)`` bundles (as ``WhisperFeatureExtractor``).

    Greedy by default (``do_sample=False``: the arg-max, ties to the lowest id as torch does);
    ``do_sample=True`` samples from softmax(logits / temperature), optionally over the
    ``top_k`` best, with ``seed`` for reproducibility. Stops early at ``eos_token_id``.
    ``prefill_chunk`` feeds a causal-LM prompt in calls of at most that many tokens, the caches
    and states carried between them (``Decoder.prefill``): the same tokens as one call.
    """
    prompt = _as_ids(input_ids)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise InvalidArgumentError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if temperature <= 0:
        raise InvalidArgumentError(f"temperature must be > 0, got {temperature!r}")
    stops = {eos_token_id} if isinstance(eos_token_id, int) else set(eos_token_id or ())
    from torchlower.llm import seq2seq_runner, vlm_runner

    several = vlm_runner.is_multimodal(Path(artifact)) or seq2seq_runner.is_seq2seq(Path(artifact))
    if prefill_chunk is not None and several:
        raise InvalidArgumentError(f"{artifact}: prefill_chunk= is for causal-LM archives (one graph)")
    if vlm_runner.is_multimodal(Path(artifact)):
        if do_sample:
            raise InvalidArgumentError(
                f"{artifact}: a multimodal LM export decodes greedily (do_sample=False)"
            )
        if audio is not None:  # its audio encoder takes the processor's features
            raise InvalidArgumentError(f"{artifact}: audio= is for speech encoder-decoder exports")
        mm = vlm_runner.MultimodalRunner(artifact, kv=kv)
        media = pixel_values if mm.media["input"] == "pixel_values" else input_features
        if media is None and (pixel_values is not None or input_features is not None):
            raise InvalidArgumentError(f"{artifact}: this model's media input is {mm.media['input']}=")
        if eos_token_id is None:  # HF's default: the generation config's end of text
            stops = set(mm.manifest.get("eos_token_id", []))
        return mm.greedy(prompt, max_new_tokens, media, feature_attention_mask, stops)[0]
    if pixel_values is not None:
        raise InvalidArgumentError(f"{artifact}: pixel_values= is for multimodal LM exports (LLaVA, …)")
    if seq2seq_runner.is_seq2seq(Path(artifact)):
        if (input_features is None) == (audio is None) or do_sample:
            raise InvalidArgumentError(
                f"{artifact}: a speech encoder-decoder needs input_features= (log-mel frames) or audio="
                " (raw samples, with the front end bundled), not both, and decodes greedily (do_sample=False)"
            )
        runner = seq2seq_runner.Seq2SeqRunner(artifact, kv=kv)
        if audio is not None:
            input_features = runner.features(audio)
        if max_new_tokens:  # the last new token is not fed back
            runner.refuse_past_context(prompt.shape[1] + max_new_tokens - 1)
        if eos_token_id is None:  # HF's default: the generation config's end of text
            stops = set(runner.manifest.get("generation", {}).get("eos_token_id", []))
        return runner.greedy(prompt[0].tolist(), max_new_tokens, input_features, stops, processors=True)[0]
    if input_features is not None or audio is not None:
        kwarg = "input_features=" if audio is None else "audio="
        raise InvalidArgumentError(f"{artifact}: {kwarg} is for speech encoder-decoder exports")
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
        logits = decoder.prefill(feed, prefill_chunk).astype(np.float64)
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

"""``torchlower llm generate ARTIFACT --ids 1,2,3 [-n N] [--media media.npz]``: decode in tract.

The command form of ``torchlower.llm.generate``: a causal-LM or state-space archive, a speech
encoder-decoder folder (``--media`` holds ``input_features``, or raw ``audio`` samples when
exported with ``--frontend``) or a multimodal LM folder
(``pixel_values``, or Qwen2-Audio's ``input_features`` and ``feature_attention_mask``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from torchlower.cli import specs
from torchlower.cli.console import Output, show_progress
from torchlower.cli.failures import usage_error

MEDIA_KEYS = ("pixel_values", "input_features", "feature_attention_mask", "audio")


def add_parser(verbs: Any, common: argparse.ArgumentParser) -> None:
    p = verbs.add_parser(
        "generate",
        parents=[common],
        help="decode new tokens in tract from an exported archive or folder",
        description="Run prefill + decode in tract (torchlower.llm.generate): greedy unless --sample."
        " For a speech encoder-decoder the ids are the decoder's start tokens; media (log-mel"
        " frames, pixels, raw audio samples with a bundled --frontend) come from --media, an .npz"
        f" whose arrays are named as generate's arguments: {', '.join(MEDIA_KEYS)}.",
    )
    p.add_argument("artifact", metavar="ARTIFACT", help="archive, or folder with manifest.json")
    p.add_argument("--ids", required=True, help="prompt token ids, comma-separated (e.g. 1,15043,29892)")
    p.add_argument("-n", "--max-new-tokens", type=int, default=16, help="tokens to generate (default 16)")
    p.add_argument("--media", metavar="MEDIA.npz", help=f"arrays named {', '.join(MEDIA_KEYS)}")
    p.add_argument("--eos", type=int, action="append", metavar="ID", help="stop at this id (repeatable)")
    p.add_argument("--sample", action="store_true", help="sample from softmax(logits / temperature)")
    p.add_argument("--temperature", type=float, default=1.0, help="with --sample (default 1.0)")
    p.add_argument("--top-k", type=int, help="with --sample: only the k best tokens")
    p.add_argument("--seed", type=int, help="with --sample: the random seed")
    p.add_argument(
        "--kv", choices=["auto", "state", "explicit"], default="auto",
        help="the KV cache as tract state (detect_kv_cache) or explicit tensors (default: state if taken)",
    )  # fmt: skip
    p.set_defaults(run=run)


def run(args: argparse.Namespace, out: Output) -> int:
    from torchlower import llm

    target = Path(args.artifact)
    if not target.exists():
        raise usage_error(f"artifact {args.artifact!r} does not exist")
    ids = _ids(args.ids)
    media = _media(args.media) if args.media else {}
    if not args.sample and (args.top_k is not None or args.seed is not None or args.temperature != 1.0):
        raise usage_error("--temperature, --top-k and --seed shape sampling; add --sample")
    started = time.perf_counter()
    with show_progress(out):
        tokens = llm.generate(
            target, [ids], args.max_new_tokens, do_sample=args.sample, temperature=args.temperature,
            top_k=args.top_k, seed=args.seed, eos_token_id=args.eos, kv=args.kv, **media,
        )  # fmt: skip
    seconds = time.perf_counter() - started
    data = {
        "ok": True,
        "path": str(target),
        "prompt": ids,
        "tokens": tokens,
        "media": {k: list(v.shape) for k, v in media.items()},
        "seconds": round(seconds, 3),
    }
    out.emit(data, lambda console: render(console, data))
    return 0


def _ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t]
    except ValueError:
        raise usage_error(f"--ids {text!r}: not integers separated by commas", "e.g. --ids 1,15,29") from None
    if not ids or any(i < 0 for i in ids):
        raise usage_error(f"--ids {text!r}: give at least one token id, each >= 0")
    return ids


def _media(path: str) -> dict[str, Any]:
    arrays = specs.read_npz(path, "--media")
    unknown = sorted(set(arrays) - set(MEDIA_KEYS)) if isinstance(arrays, dict) else ["unnamed arrays"]
    if unknown or not arrays:
        raise usage_error(
            f"--media {path!r}: {', '.join(unknown) or 'no arrays'}; it holds generate's media arguments",
            f"save them by name: numpy.savez(path, {MEDIA_KEYS[0]}=x) ({', '.join(MEDIA_KEYS)}).",
        )
    return dict(arrays)


def render(console: Console, data: dict[str, Any]) -> None:
    media = ", ".join(f"{k} {v}" for k, v in data["media"].items())
    console.print(f"generated in tract from {data['path']}" + (f" with {media}" if media else ""))
    console.print(f"prompt  {' '.join(map(str, data['prompt']))}")
    console.print(f"tokens  {' '.join(map(str, data['tokens']))}")
    console.print(f"{len(data['tokens'])} tokens in {data['seconds']:.2f} s")

"""Whisper in tract (torchlower.llm.export) vs Hugging Face eager PyTorch, single thread: encoder
time and decode ms/token, on random models shaped like whisper-tiny and a smaller one.

    python -m bench.whisper_decode WORKDIR [--config tiny small] [--tokens 32] [--rounds 5]
                                   [--variants f32 q4_0 f16] [--extra NAME=FOLDER ...]

Per config, the exports (checked against HF) go to WORKDIR/CONFIG/VARIANT (reused when present);
``--extra`` adds other export folders of the same model (e.g. one written by another branch, for
a before/after in one process). Then, round after round, interleaved: each tract folder runs the
encoder on the same features and decodes 1 + N greedy tokens (``Seq2SeqRunner.step``, what
``llm.generate`` runs: the self-attention cache as tract state, the cross keys/values kept as
tract tensors); HF runs its encoder and ``generate`` with its cache (minus the 1-token generate,
over N). Medians, the ratios to HF and the load average before and after (the machine is shared:
absolute times move with the load, interleaved ratios much less).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ["RAYON_NUM_THREADS"] = "1"  # before tract loads
os.environ["TRACT_FLASH_SDPA_ST"] = "1"
os.environ.setdefault("HF_HUB_OFFLINE", "1")

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TINY = {  # whisper-tiny's shapes (39 M parameters)
    "vocab_size": 51865, "num_mel_bins": 80, "encoder_layers": 4, "decoder_layers": 4,
    "encoder_attention_heads": 6, "decoder_attention_heads": 6, "encoder_ffn_dim": 1536,
    "decoder_ffn_dim": 1536, "d_model": 384, "max_source_positions": 1500, "max_target_positions": 448,
}  # fmt: skip
SMALL = TINY | {
    "vocab_size": 4000, "max_source_positions": 300, "d_model": 256, "encoder_ffn_dim": 1024,
    "decoder_ffn_dim": 1024, "encoder_attention_heads": 4, "decoder_attention_heads": 4,
}  # fmt: skip
CONFIGS = {"tiny": TINY, "small": SMALL}
VARIANTS = {"f32": ("f32", None), "f16": ("f16", None), "q4_0": ("f32", "q4_0")}  # precision, compress
SPECIAL = {
    "decoder_start_token_id": 1, "pad_token_id": 0, "eos_token_id": None, "bos_token_id": None,
    "suppress_tokens": None, "begin_suppress_tokens": None, "forced_decoder_ids": None,
}  # fmt: skip


def load_line() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f}, {five:.2f}, {fifteen:.2f}"


def tract_decode(runner: Any, features: Any, n: int) -> tuple[float, float, list[int]]:
    """(encoder s, decode s/token, tokens): the start token's step, then ``n`` timed steps."""
    import numpy as np

    t = time.perf_counter()
    runner.encode(features)
    encoder = time.perf_counter() - t
    token = int(np.argmax(runner.step(np.array([[1]]))))
    tokens = [token]
    t = time.perf_counter()
    for _ in range(n):
        token = int(np.argmax(runner.step(np.array([[token]]))))
        tokens.append(token)
    return encoder, (time.perf_counter() - t) / n, tokens


def hf_decode(model: Any, features: Any, n: int) -> tuple[float, float, list[int]]:
    import torch

    with torch.no_grad():
        t = time.perf_counter()
        enc = model.model.encoder(features)
        encoder = time.perf_counter() - t
        start = torch.tensor([[1]])
        t = time.perf_counter()
        model.generate(encoder_outputs=enc, decoder_input_ids=start, max_new_tokens=1, do_sample=False)
        one = time.perf_counter() - t
        t = time.perf_counter()
        out = model.generate(encoder_outputs=enc, decoder_input_ids=start, max_new_tokens=n + 1,
                             min_new_tokens=n + 1, do_sample=False)  # fmt: skip
        decode = (time.perf_counter() - t - one) / n
    return encoder, decode, out[0, -(n + 1) :].tolist()  # Whisper's generate drops the start token


def bench_config(name: str, workdir: Path, args: Any) -> None:
    import statistics

    import torch
    import transformers

    from torchlower import llm
    from torchlower.llm.seq2seq_runner import Seq2SeqRunner

    shape = CONFIGS[name]
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(
        transformers.WhisperConfig(**shape, **SPECIAL)
    ).eval()
    model.generation_config.max_length = None  # max_new_tokens decides (no warning every call)
    folder = workdir / "hf"
    if not folder.exists():
        model.save_pretrained(folder)
    folders: dict[str, Path] = {}
    for variant in args.variants:
        out = folders[variant] = workdir / variant
        if not out.exists():
            precision, compress = VARIANTS[variant]
            started = time.perf_counter()
            report = llm.export(folder, out, precision=precision, compress=compress)
            same = report.tokens == report.reference_tokens
            print(f"{name} {variant}: export {time.perf_counter() - started:.1f} s, tokens equal {same},"
                  f" logit error {report.logit_error:.2g}, {report.archive_bytes:,} bytes")  # fmt: skip
    folders |= {k: Path(v) for k, v in (item.split("=", 1) for item in args.extra)}
    frames = 2 * shape["max_source_positions"]
    features = torch.randn(1, shape["num_mel_bins"], frames, generator=torch.Generator().manual_seed(1))
    runners = {k: Seq2SeqRunner(f) for k, f in folders.items()}
    rows: dict[str, dict[str, list[float]]] = {k: {"encoder": [], "decode": []} for k in [*runners, "hf"]}
    matched: dict[str, int] = {}
    reference: list[int] = []
    before = load_line()
    for _ in range(args.rounds):
        for key, runner in runners.items():
            enc, dec, _ = tract_decode(runner, features.numpy(), args.tokens)
            rows[key]["encoder"].append(enc)
            rows[key]["decode"].append(dec)
        enc, dec, reference = hf_decode(model, features, args.tokens)
        rows["hf"]["encoder"].append(enc)
        rows["hf"]["decode"].append(dec)
    for key, runner in runners.items():  # greedy tokens equal to HF's, from the start
        tokens = tract_decode(runner, features.numpy(), args.tokens)[2]
        matched[key] = next(
            (i for i, (a, b) in enumerate(zip(tokens, reference, strict=False)) if a != b), len(tokens)
        )
    med = {k: {part: statistics.median(v) * 1000 for part, v in r.items()} for k, r in rows.items()}
    hf = med["hf"]
    kind = "whisper-tiny shapes" if name == "tiny" else "smaller"
    print(f"\n== {name} ({kind}: d_model {shape['d_model']}, vocab {shape['vocab_size']}, {frames} frames);"
          f" single thread; medians of {args.rounds} interleaved rounds;"
          f" {before} before, {load_line()} after")  # fmt: skip
    head = f"{'encoder ms':>11s} {'decode ms/token':>16s} {'enc / HF':>9s} {'dec / HF':>9s}"
    print(f"{'':14s} {head}  greedy tokens = HF's")
    for key, m in med.items():
        same = f"{matched[key]}/{args.tokens + 1}" if key in matched else ""
        print(f"{key:14s} {m['encoder']:11.1f} {m['decode']:16.2f} {m['encoder'] / hf['encoder']:9.2f}"
              f" {m['decode'] / hf['decode']:9.2f}  {same}")  # fmt: skip


def main() -> None:
    import argparse

    import torch

    from tests import torchvision_shim

    torchvision_shim.install()
    ap = argparse.ArgumentParser()
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--config", nargs="+", choices=sorted(CONFIGS), default=["tiny", "small"])
    ap.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=["f32"])
    ap.add_argument("--extra", nargs="*", default=[], help="NAME=FOLDER: more tract exports of the config")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    if args.extra and len(args.config) != 1:
        ap.error("--extra folders belong to one --config")
    torch.set_num_threads(1)
    for name in args.config:
        (args.workdir / name).mkdir(parents=True, exist_ok=True)
        bench_config(name, args.workdir / name, args)


if __name__ == "__main__":
    main()

"""Whisper in tract (torchlower.llm.export) vs Hugging Face eager PyTorch, single thread: encoder
time and decode ms/token, on a random model shaped like whisper-tiny (or smaller with --small).

    python -m bench.whisper_decode WORKDIR [--small] [--tokens 32] [--rounds 5]

The export (checked against HF) writes WORKDIR/whisper_tract; then, round after round, the
encoder runs on the same features in both, and 1 + N greedy tokens are decoded (tract: the
decoder archive with its self-attention cache as tract state; HF: ``generate`` with its cache,
minus the 1-token generate, over N). Medians with the load average.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

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


def main() -> None:
    import argparse
    import statistics

    import numpy as np
    import torch
    import transformers

    from tests import torchvision_shim

    torchvision_shim.install()
    from torchlower import llm
    from torchlower.llm.seq2seq_runner import Seq2SeqRunner

    ap = argparse.ArgumentParser()
    ap.add_argument("workdir", type=Path)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    shape = SMALL if args.small else TINY
    special = {
        "decoder_start_token_id": 1, "pad_token_id": 0, "eos_token_id": None, "bos_token_id": None,
        "suppress_tokens": None, "begin_suppress_tokens": None, "forced_decoder_ids": None,
    }  # fmt: skip
    torch.manual_seed(0)
    model = transformers.WhisperForConditionalGeneration(
        transformers.WhisperConfig(**shape, **special)
    ).eval()
    folder = args.workdir / "hf"
    model.save_pretrained(folder)
    out = args.workdir / "whisper_tract"
    if not out.exists():
        started = time.perf_counter()
        report = llm.export(folder, out)
        same = report.tokens == report.reference_tokens
        print(f"export {time.perf_counter() - started:.1f} s, tokens equal {same},"
              f" logit error {report.logit_error:.2g}, {report.archive_bytes:,} bytes")  # fmt: skip
    frames = 2 * shape["max_source_positions"]
    features = torch.randn(1, shape["num_mel_bins"], frames, generator=torch.Generator().manual_seed(1))
    runner = Seq2SeqRunner(out)
    n = args.tokens
    rows: dict[str, list[float]] = {
        k: [] for k in ("tract encoder", "tract decode", "hf encoder", "hf decode")
    }
    for _ in range(args.rounds):
        t = time.perf_counter()
        runner.encode(features.numpy())
        rows["tract encoder"].append(time.perf_counter() - t)
        feed = np.array([[1]])
        runner.reset()
        runner.step(feed)  # the first token: prefill of the start token
        t = time.perf_counter()
        token = 1
        for _ in range(n):
            token = int(np.argmax(runner.step(np.array([[token]]))))
        rows["tract decode"].append((time.perf_counter() - t) / n)
        with torch.no_grad():
            t = time.perf_counter()
            enc = model.model.encoder(features)
            rows["hf encoder"].append(time.perf_counter() - t)
            start = torch.tensor([[1]])
            t = time.perf_counter()
            model.generate(encoder_outputs=enc, decoder_input_ids=start, max_new_tokens=1, do_sample=False)
            one = time.perf_counter() - t
            t = time.perf_counter()
            model.generate(encoder_outputs=enc, decoder_input_ids=start, max_new_tokens=n + 1,
                           min_new_tokens=n + 1, do_sample=False)  # fmt: skip
            rows["hf decode"].append((time.perf_counter() - t - one) / n)
    med = {k: statistics.median(v) * 1000 for k, v in rows.items()}
    print(
        f"load average {os.getloadavg()[0]:.2f}; single thread;"
        f" {'small' if args.small else 'whisper-tiny shapes'}"
    )
    for k, v in med.items():
        print(f"{k:14s} {v:9.2f} ms{'/token' if 'decode' in k else ''}")
    print(f"decode ratio tract/hf {med['tract decode'] / med['hf decode']:.2f}, encoder ratio"
          f" {med['tract encoder'] / med['hf encoder']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()

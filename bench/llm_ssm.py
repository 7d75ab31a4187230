"""State-space and hybrid LMs (Mamba, Mamba2, Bamba) in tract vs Hugging Face (issue 31, item 3).

``python -m bench.llm_ssm [OUT.md [NAME ...]]`` (from the repo root; uses tests/llm_models.py):
1. the tiny test configs × {f32, f16, q4_0}: logit error vs HF f32 (the check's four inputs),
   greedy tokens equal to HF ``generate`` (of 32), archive bytes;
2. decode ms/token, tract (explicit states; Bamba's KV cache as tract state) vs HF eager with its
   own cache (the slow PyTorch path: no mamba-ssm kernels), single thread, interleaved rounds,
   for the tiny configs and for a larger one per family (hidden 256, 4 layers, vocab 4096).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TRACT_FLASH_SDPA_ST", "1")
import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import llm_models, torchvision_shim  # noqa: E402

torchvision_shim.install()  # transformers' modeling imports torchvision (a CUDA wheel here)
from torchlower import llm  # noqa: E402
from torchlower.llm import ssm  # noqa: E402
from torchlower.llm.runner import Decoder  # noqa: E402
from torchlower.llm.wrapper import present_cache  # noqa: E402

OPTIONS = {"f32": {}, "f16": {"precision": "f16"}, "q4_0": {"compress": "q4_0"}}
PROMPT = torch.tensor([[3, 17, 42, 9, 101]])
LARGER = {
    "mamba": ("MambaConfig", dict(vocab_size=4096, hidden_size=256, state_size=16, num_hidden_layers=4)),
    "mamba2": ("Mamba2Config", dict(vocab_size=4096, hidden_size=256, state_size=16, num_hidden_layers=4,
                                    head_dim=32, num_heads=16, n_groups=1, chunk_size=64)),
    "bamba": ("BambaConfig", dict(vocab_size=4096, hidden_size=256, intermediate_size=512, num_hidden_layers=4,  # noqa: E501
                                  num_attention_heads=8, num_key_value_heads=4, attn_layer_indices=[1, 3],
                                  mamba_n_heads=16, mamba_d_head=32, mamba_d_state=16, mamba_chunk_size=64,
                                  max_position_embeddings=512)),
    "qwen3_next": ("Qwen3NextConfig", dict(vocab_size=4096, hidden_size=256, intermediate_size=512,
                                           num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"],
                                           num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                                           linear_num_value_heads=8, linear_num_key_heads=4, linear_key_head_dim=32,
                                           linear_value_head_dim=32, num_experts=8, num_experts_per_tok=2,
                                           moe_intermediate_size=128, shared_expert_intermediate_size=256,
                                           max_position_embeddings=512)),
}  # fmt: skip
STEPS, ROUNDS = 32, 5


def main(out: Path | None) -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    lines = ["| model | format | logit err vs HF f32 | greedy = HF (of 32) | archive B | export s |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    speed = ["| model | size | tract ms/token | HF eager ms/token | tract / HF |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for name in sys.argv[2:] or llm_models.SSM_CONFIGS:
            model = llm_models.build_ssm(name)
            want = llm_models.greedy(model, PROMPT, 32)
            for fmt, options in OPTIONS.items():
                t0 = time.perf_counter()
                r = llm.export(model, Path(tmp) / f"{name}-{fmt}.nnef.tgz", **options)
                seconds = time.perf_counter() - t0
                got = llm.generate(r.path, PROMPT, 32)
                same = sum(a == b for a, b in zip(got, want, strict=True))
                lines.append(
                    f"| {name} | {fmt} | {r.logit_error:.2e} | {same} | {r.archive_bytes:,} | {seconds:.1f} |"
                )
                print(lines[-1], flush=True)
                if fmt == "f32":
                    speed.append(_speed_row(name, "tiny", model, r.path))
                    print(speed[-1], flush=True)
            import transformers

            cls, fields = LARGER[name]
            config = getattr(transformers, cls)(**llm_models.NO_SPECIAL, **fields)
            big = llm_models.from_config(config, std=0.05, keep=("A_log",))
            r = llm.export(big, Path(tmp) / f"{name}-big.nnef.tgz")
            size = f"{sum(p.numel() for p in big.parameters()) / 1e6:.1f} M params"
            speed.append(_speed_row(name, size, big, r.path))
            print(speed[-1], flush=True)
    tail = f"\nsingle thread; load average at the end: {os.getloadavg()}"
    text = "\n".join([*lines, "", *speed, tail]) + "\n"
    if out is not None:
        out.write_text(text)
    print(text)


def _speed_row(name: str, size: str, model: torch.nn.Module, path: Path) -> str:
    """Median over interleaved rounds of the per-token time of STEPS one-token decodes after the prompt."""
    decoder = Decoder(path)
    tract_ms, hf_ms = [], []
    for _ in range(ROUNDS):
        decoder.reset()
        logits = decoder.step(PROMPT.numpy())
        t0 = time.perf_counter()
        for _ in range(STEPS):
            logits = decoder.step(np.array([[int(np.argmax(logits))]]))
        tract_ms.append((time.perf_counter() - t0) * 1e3 / STEPS)
        out = ssm.hf_forward(model, PROMPT)
        cache, token, length = present_cache(out), out.logits[:, -1:].argmax(-1), PROMPT.shape[1]
        t0 = time.perf_counter()
        for _ in range(STEPS):
            out = ssm.hf_forward(model, token, cache, length)
            cache, token, length = present_cache(out), out.logits[:, -1:].argmax(-1), length + 1
        hf_ms.append((time.perf_counter() - t0) * 1e3 / STEPS)
    t, h = statistics.median(tract_ms), statistics.median(hf_ms)
    return f"| {name} | {size} | {t:.3f} | {h:.3f} | {t / h:.2f} |"


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else None)

"""Peak RSS of ``torchlower.llm.export`` on a ≥ 1 GB f32 Llama checkpoint, in a fresh process.

``python -m bench.llm_bigmem make DIR`` writes the checkpoint (random weights, save_pretrained);
``python -m bench.llm_bigmem export DIR OUT [--compress q4_0]`` prints one JSON line: checkpoint
bytes, RSS baseline (after imports, before the export), peak above it during the export
(VmHWM), wall time, archive bytes. Target (issue 14): peak ≤ 25 % of the checkpoint size.
The export runs with ``check=False``: the check would run the whole model in PyTorch and tract.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

# hidden 2048, 3 layers, vocab 32000, untied: 288 M parameters, 1.15 GB in f32
CONFIG = {
    "vocab_size": 32000, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 3,
    "num_attention_heads": 16, "num_key_value_heads": 4, "max_position_embeddings": 2048,
    "tie_word_embeddings": False, "bos_token_id": None, "eos_token_id": None, "pad_token_id": None,
}  # fmt: skip


def make(folder: Path) -> None:
    import torch
    import transformers

    torch.manual_seed(0)
    with torch.device("cpu"):
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG)).eval()
    model.save_pretrained(folder)


def export(folder: Path, out: Path, compress: str | None) -> dict[str, object]:
    import torch

    from bench import memory
    from torchlower import llm

    torch.set_num_threads(1)
    checkpoint = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    base = memory.reset_peak()
    t0 = time.perf_counter()
    report = llm.export(folder, out, compress=compress, check=False)
    seconds = time.perf_counter() - t0
    peak = memory.peak() - base
    return {
        "checkpoint_bytes": checkpoint,
        "compress": compress,
        "baseline_rss": base,
        "peak_above_baseline": peak,
        "peak_fraction": round(peak / checkpoint, 4),
        "export_s": round(seconds, 2),
        "archive_bytes": report.archive_bytes,
        "load_avg": os.getloadavg(),
    }


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(Path(sys.argv[2]))
    else:
        compress = sys.argv[4].split("=", 1)[1] if len(sys.argv) > 4 else None
        print(json.dumps(export(Path(sys.argv[2]), Path(sys.argv[3]), compress)))

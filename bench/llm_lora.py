"""LoRA adapters merged and separate, f32 and f16, against peft's own greedy tokens (docs/llm.md table).

``python -m bench.llm_lora`` (from the repo root, peft installed). Tiny random Llama and Qwen2
bases; a LoRA of rank 4 on q/k/v/o/gate/up/down with random A and B (std 0.6): Llama with a
``rank_pattern`` and an ``alpha_pattern``, Qwen2 (tied embeddings) with ``use_rslora``. Each is
exported four ways with the check on; one line per export: tokens equal to
``PeftModel.generate`` out of 32, where the chains first part, the check's logit error.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import llm_models, torchvision_shim  # noqa: E402

torchvision_shim.install()
from torchlower import llm  # noqa: E402

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
PROMPT = torch.tensor([[3, 17, 42, 9, 101]])
OPTIONS: dict[str, dict[str, Any]] = {
    "llama": {"rank_pattern": {"down_proj": 8}, "alpha_pattern": {"q_proj": 4}},
    "qwen2": {"use_rslora": True},
}


def adapter(name: str, folder: Path) -> list[int]:
    """Save a random LoRA for ``name`` in ``folder``; returns peft's 32 greedy tokens."""
    import peft

    config = peft.LoraConfig(r=4, lora_alpha=16, target_modules=TARGETS, **OPTIONS[name])
    model = peft.get_peft_model(llm_models.build(name), config)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for key, p in model.named_parameters():
            if "lora_" in key:
                p.copy_(torch.randn(p.shape, generator=g) * 0.6)
    model.eval().save_pretrained(folder)
    with torch.no_grad():
        out = model.generate(input_ids=PROMPT, max_new_tokens=32, do_sample=False, min_new_tokens=32)
    return out[0, PROMPT.shape[1] :].tolist()


def main() -> None:
    with tempfile.TemporaryDirectory() as work:
        root = Path(work)
        for name in OPTIONS:
            llm_models.build(name).save_pretrained(root / name)
            want = adapter(name, root / f"{name}_lora")
            for merge in (True, False):
                for precision in ("f32", "f16"):
                    out = root / f"{name}_{merge}_{precision}.nnef.tgz"
                    report = llm.export(
                        root / name, out, lora=root / f"{name}_lora", merge_lora=merge, precision=precision
                    )
                    got = llm.generate(report.path, PROMPT, 32)
                    first = next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), 32)
                    same = sum(a == b for a, b in zip(got, want, strict=True))
                    kind = "merged" if merge else "separate"
                    print(f"{name} {kind} {precision}: {same}/32 tokens, first apart at {first}, "
                          f"logit error {report.logit_error:.2g}")  # fmt: skip


if __name__ == "__main__":
    main()

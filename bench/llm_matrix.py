"""Every tiny architecture × {f32, f16, q4_0}: logit error vs HF, greedy tokens matched, sizes.

``python -m bench.llm_matrix [OUT.md]`` (from the repo root; uses tests/llm_models.py).
Per row: max |HF f32 − tract| over the logits of the three checked inputs (prefill P=0,
continuation P=6, decode P=9) against the *original* f32 model, the check's own error (f16:
vs HF f32; q4_0: vs HF running the dequantized weights), how many of 32 greedy tokens equal HF
``generate`` on the f32 model, weight bytes, archive bytes, how many weights Q4_0 was asked for
stayed float (``report.unquantized``), export seconds. q4_0 uses the defaults: linear layers and
the LM head in Q4_0, the embedding table f32. f16 and q4_0 tokens
are expected to part from the f32 chain at some point: they measure the format. *HF margin
there* is the gap between HF f32's two best logits at the first step where the greedy tokens
part (teacher-forced on HF's own chain, so the export saw the same prefix): a margin below the
logit error is a near tie any rounding can flip (HF's own f16 flips them too), not a defect.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import llm_models  # noqa: E402
from torchlower import llm  # noqa: E402

ARCHES = ["llama", "qwen2", "mistral", "phi3", "phi", "gemma", "gpt2", "gpt_neox", "opt", "falcon", "bloom",
          "llama_dynamic_rope", "llama_linear_rope"]  # fmt: skip
OPTIONS = {"f32": {}, "f16": {"precision": "f16"}, "q4_0": {"compress": "q4_0"}}
PROMPT = torch.tensor([[3, 17, 42, 9, 101]])


def main(out: Path | None) -> None:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    header = (
        "| arch | format | logit err vs HF f32 | check err | greedy = HF up to (of 32) | HF margin there |"
        " weights B | archive B | left float | export s |"
    )
    lines = [header, "|---|---|---|---|---|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as tmp:
        for arch in ARCHES:
            model = llm_models.build(arch)
            want = llm_models.greedy(model, PROMPT, 32)
            margins = _margins(model, want)
            for fmt, options in OPTIONS.items():
                t0 = time.perf_counter()
                try:
                    r = llm.export(model, Path(tmp) / f"{arch}-{fmt}.nnef.tgz", **options)
                except Exception as exc:  # a row per failure, the table goes on
                    reason = f"{type(exc).__name__}: {str(exc)[:120]}"
                    lines.append(f"| {arch} | {fmt} | failed: {reason} | | | | | | | |")
                    print(lines[-1], flush=True)
                    continue
                seconds = time.perf_counter() - t0
                got = llm.generate(r.path, PROMPT, 32)
                same = next((i for i, (a, b) in enumerate(zip(got, want, strict=True)) if a != b), 32)
                lines.append(
                    f"| {arch} | {fmt} | {r.logit_error:.2e} | {r.max_abs_error:.2e} | {same} | "
                    f"{margin(margins, same)} | {r.weight_bytes:,} | {r.archive_bytes:,} | "
                    f"{len(r.unquantized)} | {seconds:.1f} |"
                )
                print(lines[-1], flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    lines.append(f"\nload average at the end: {os.getloadavg()}; commit {commit.stdout.strip()}")
    if out is not None:
        out.write_text("\n".join(lines) + "\n")


def _margins(model: torch.nn.Module, chain: list[int]) -> list[float]:
    """HF f32's best minus second-best logit before each token of its own greedy ``chain``."""
    seq = torch.cat([PROMPT, torch.tensor([chain])], 1)
    with torch.no_grad():
        logits = model(seq).logits[0, PROMPT.shape[1] - 1 : -1].double()
    top = logits.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


def margin(margins: list[float], same: int) -> str:
    return "" if same >= len(margins) else f"{margins[same]:.2g}"


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else None)

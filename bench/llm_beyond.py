"""Causal LMs beyond the tested list, as a user would try them: what exports, what refuses, how.

``python -m bench.llm_beyond [--precision f16] [--compress q4_0] [NAME ...]`` (from the repo
root). Each is a tiny random model built from its transformers config (2 layers, hidden 32,
vocab 160; never the hub), exported with the check on, then 32 greedy tokens in tract against
HF ``generate`` (5 + 32 positions: they cross Phi-3 longrope's switch at 16). One line per
model: ``exported`` with the logit error and the tokens matched, ``typed`` with the
torchlower error, or ``RAW`` for any other exception (a bug: every failure must be a typed
error). With f16 or q4_0 the greedy tokens measure the format (they part from the f32 chain
at some point); the check must still pass.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import llm_models  # noqa: E402
from torchlower import errors, llm  # noqa: E402
from torchlower.llm.exporter import COMPRESSIONS, PRECISIONS  # noqa: E402

BASE = llm_models.LLAMA_LIKE
GPT = {"vocab_size": 160, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 128}
LONGROPE = {"type": "longrope", "short_factor": [1.0, 1.1, 1.2, 1.3], "long_factor": [2.0, 3.0, 4.0, 5.0]}
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3": ("Qwen3Config", BASE | {"num_key_value_heads": 2, "head_dim": 8}),
    "gemma2": ("Gemma2Config", BASE | {"num_key_value_heads": 2, "head_dim": 8, "sliding_window": 6}),
    "gemma3_text": (
        "Gemma3TextConfig",
        BASE | {"num_key_value_heads": 2, "head_dim": 8, "sliding_window": 6},
    ),
    "olmo": ("OlmoConfig", BASE),
    "olmo2": ("Olmo2Config", BASE),
    "stablelm": ("StableLmConfig", BASE | {"num_key_value_heads": 2}),
    "starcoder2": ("Starcoder2Config", BASE | {"num_key_value_heads": 2, "sliding_window": 6}),
    "gptj": ("GPTJConfig", GPT | {"rotary_dim": 4}),
    "gpt_bigcode": ("GPTBigCodeConfig", GPT),
    "codegen": ("CodeGenConfig", GPT | {"rotary_dim": 4}),
    "cohere": ("CohereConfig", BASE | {"num_key_value_heads": 2}),
    "granite": ("GraniteConfig", BASE | {"num_key_value_heads": 2}),
    "biogpt": ("BioGptConfig", BASE),
    "persimmon": ("PersimmonConfig", BASE),
    "nemotron": ("NemotronConfig", BASE | {"num_key_value_heads": 2}),
    "helium": ("HeliumConfig", BASE | {"num_key_value_heads": 2, "head_dim": 8}),
    "glm": ("GlmConfig", BASE | {"num_key_value_heads": 2, "head_dim": 8}),
    "smollm3": ("SmolLM3Config", BASE | {"num_key_value_heads": 2}),
    "exaone4": ("Exaone4Config", BASE | {"num_key_value_heads": 2}),
    "phi3_longrope": (
        "Phi3Config",
        BASE | {"num_key_value_heads": 2, "original_max_position_embeddings": 16, "rope_scaling": LONGROPE},
    ),
    "llama_yarn": (
        "LlamaConfig",
        BASE
        | {
            "rope_parameters": {
                "rope_type": "yarn",
                "factor": 2.0,
                "rope_theta": 1e4,
                "original_max_position_embeddings": 64,
            }
        },
    ),
    "llama_llama3": (
        "LlamaConfig",
        BASE
        | {
            "rope_parameters": {
                "rope_type": "llama3",
                "factor": 8.0,
                "rope_theta": 1e4,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        },
    ),
    "mixtral": (
        "MixtralConfig",
        BASE | {"num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    # mixture of experts (llm/moe.py: every expert on every token, weighted by the router)
    "qwen2_moe": (
        "Qwen2MoeConfig",
        BASE
        | {"num_key_value_heads": 2, "num_experts": 4, "num_experts_per_tok": 2}
        | {"moe_intermediate_size": 16, "shared_expert_intermediate_size": 32},
    ),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        BASE
        | {"num_key_value_heads": 2, "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2}
        | {"moe_intermediate_size": 16},
    ),
    "olmoe": ("OlmoeConfig", BASE | {"num_experts": 4, "num_experts_per_tok": 2}),
    "granitemoe": ("GraniteMoeConfig", BASE | {"num_local_experts": 4, "num_experts_per_tok": 2}),
    "phimoe": (
        "PhimoeConfig",
        BASE | {"num_key_value_heads": 2, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    "gpt_oss": (
        "GptOssConfig",
        BASE
        | {"num_key_value_heads": 2, "head_dim": 8, "num_local_experts": 4, "num_experts_per_tok": 2}
        | {"sliding_window": 6},
    ),
    "deepseek_v3": (
        "DeepseekV3Config",
        BASE
        | {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16, "n_group": 1}
        | {"topk_group": 1, "first_k_dense_replace": 1, "q_lora_rank": 16, "kv_lora_rank": 16}
        | {"qk_rope_head_dim": 4, "qk_nope_head_dim": 4, "v_head_dim": 8, "num_key_value_heads": 4},
    ),
    "glm4_moe": (
        "Glm4MoeConfig",
        BASE
        | {"num_key_value_heads": 2, "head_dim": 8, "n_routed_experts": 4, "num_experts_per_tok": 2}
        | {"moe_intermediate_size": 16, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1},
    ),
    "mpt": ("MptConfig", {"vocab_size": 160, "d_model": 32, "n_layers": 2, "n_heads": 4, "max_seq_len": 128}),
    "xglm": (
        "XGLMConfig",
        {
            "vocab_size": 160,
            "d_model": 32,
            "num_layers": 2,
            "attention_heads": 4,
            "ffn_dim": 64,
            "max_position_embeddings": 128,
        },
    ),
}
PROMPT = torch.tensor([[3, 17, 42, 9, 101]])


def build(name: str) -> Any:
    import transformers

    cls, fields = CONFIGS[name]
    return llm_models.from_config(getattr(transformers, cls)(**(llm_models.NO_SPECIAL | fields)))


def try_one(name: str, folder: Path, options: dict[str, str]) -> str:
    model = build(name)
    started = time.perf_counter()
    try:
        report = llm.export(model, folder / f"{name}.nnef.tgz", **options)
    except errors.TorchlowerError as exc:
        return f"typed {type(exc).__name__}: {' '.join(str(exc).split())[:240]}"
    except Exception as exc:  # the point is to see it
        return f"RAW {type(exc).__name__}: {' '.join(str(exc).split())[:240]}"
    seconds = time.perf_counter() - started
    want = llm_models.greedy(model, PROMPT, 32)
    got = llm.generate(report.path, PROMPT, 32)
    same = next((i for i, (a, b) in enumerate(zip(want, got, strict=True)) if a != b), len(want))
    return f"exported in {seconds:.1f} s, logit error {report.logit_error:.1e}, greedy {same}/32"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="f32", choices=PRECISIONS)
    parser.add_argument("--compress", default=None, choices=[c for c in COMPRESSIONS if c])
    parser.add_argument("names", nargs="*", metavar="NAME", help=", ".join(CONFIGS))
    args = parser.parse_args(argv)
    options = {"precision": args.precision} | ({"compress": args.compress} if args.compress else {})
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    print(f"load average {os.getloadavg()[0]:.2f}, {options}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.names or list(CONFIGS):
            print(f"{name}: {try_one(name, Path(tmp), options)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Tiny random causal LMs built from configs (2 layers, hidden 32-64, vocab ~100-300; never the hub).

No bos/eos/pad ids: ``generate`` then runs the full length without special-token processing,
so its greedy tokens are the plain arg-max chain tract must reproduce.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

NO_SPECIAL = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}
LLAMA_LIKE = {
    "vocab_size": 160,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 128,
}


def _config(name: str, **fields: Any) -> Any:
    import transformers

    return getattr(transformers, name)(**(NO_SPECIAL | fields))


SMALL = {"vocab_size": 160, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
CONFIGS: dict[str, Callable[[], Any]] = {
    "llama": lambda: _config("LlamaConfig", **LLAMA_LIKE, num_key_value_heads=2),
    "llama_linear_rope": lambda: _config(
        "LlamaConfig", **LLAMA_LIKE, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}
    ),
    "llama_dynamic_rope": lambda: _config(
        "LlamaConfig",
        **LLAMA_LIKE,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
    ),
    "qwen2": lambda: _config("Qwen2Config", **LLAMA_LIKE, num_key_value_heads=2, tie_word_embeddings=True),
    "mistral": lambda: _config("MistralConfig", **LLAMA_LIKE, num_key_value_heads=1, sliding_window=5),
    "phi3": lambda: _config("Phi3Config", **LLAMA_LIKE, num_key_value_heads=2),
    # Phi-3 128k's longrope: short factors up to 16 positions, long beyond (and HF's generate
    # recomputes the cache when it crosses)
    "phi3_longrope": lambda: _config(
        "Phi3Config",
        **LLAMA_LIKE,
        num_key_value_heads=2,
        original_max_position_embeddings=16,
        rope_scaling={
            "type": "longrope",
            "short_factor": [1.0, 1.1, 1.2, 1.3],
            "long_factor": [2.0, 3.0, 4.0, 5.0],
        },
    ),
    "phi": lambda: _config("PhiConfig", **LLAMA_LIKE, num_key_value_heads=4),
    "gemma": lambda: _config("GemmaConfig", **LLAMA_LIKE, num_key_value_heads=1, head_dim=16),
    "gpt2": lambda: _config("GPT2Config", vocab_size=160, n_embd=32, n_layer=2, n_head=4, n_positions=128),
    "gpt_neox": lambda: _config("GPTNeoXConfig", **LLAMA_LIKE),
    "opt": lambda: _config(
        "OPTConfig",
        vocab_size=160,
        hidden_size=32,
        num_hidden_layers=2,
        ffn_dim=64,
        num_attention_heads=4,
        word_embed_proj_dim=32,
        max_position_embeddings=128,
    ),
    "falcon": lambda: _config(
        "FalconConfig", **SMALL, multi_query=True, alibi=False, max_position_embeddings=128
    ),
    "falcon_alibi": lambda: _config(
        "FalconConfig", **SMALL, multi_query=False, alibi=True, max_position_embeddings=128
    ),
    "bloom": lambda: _config("BloomConfig", vocab_size=160, hidden_size=32, n_layer=2, n_head=4),
    # mixture of experts, traced densely (llm/moe.py); Qwen2-MoE adds a gated shared expert
    "mixtral": lambda: _config(
        "MixtralConfig", **LLAMA_LIKE, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2
    ),
    "qwen2_moe": lambda: _config(
        "Qwen2MoeConfig",
        **LLAMA_LIKE,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=32,
    ),
    # DeepSeek's MLA: a latent cache, keys as [per-head part, shared rotary part broadcast over
    # heads] (nnef/guards_matmul.broadcast_as_product); one dense layer keeps it small
    "deepseek_v3": lambda: _config(
        "DeepseekV3Config",
        **(LLAMA_LIKE | {"num_hidden_layers": 1}),
        num_key_value_heads=4,
        first_k_dense_replace=1,
        q_lora_rank=16,
        kv_lora_rank=16,
        qk_rope_head_dim=4,
        qk_nope_head_dim=4,
        v_head_dim=8,
    ),
    # ALiBi from a table of max_seq_len positions, sliced with torch.sym_max of sizes
    "mpt": lambda: _config("MptConfig", vocab_size=160, d_model=32, n_layers=2, n_heads=4, max_seq_len=128),
}


def build(name: str, seed: int = 0) -> Any:
    """The model in eval mode with seeded random weights (std 0.6: greedy chains that move)."""
    return from_config(CONFIGS[name](), seed)


def from_config(config: Any, seed: int = 0, std: float = 0.6, keep: tuple[str, ...] = ()) -> Any:
    """``build`` for any causal-LM config; parameters whose name ends with one of ``keep`` keep
    their own initialization."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2 and not name.endswith(keep):
                p.normal_(0.0, std)
    return model


# state-space models: std 0.3 and HF's own A_log (decays log 1..N) keep the states within f16
# while the greedy chains still move (std 0.6 drives Mamba's mixer outputs past 5e5)
SSM_CONFIGS: dict[str, Callable[[], Any]] = {
    "mamba": lambda: _config(
        "MambaConfig", vocab_size=160, hidden_size=32, state_size=8, num_hidden_layers=2, conv_kernel=4
    ),
    # chunk_size 4: HF's chunked prefill of the check's 6 and 9 tokens crosses chunks; 2 groups
    "mamba2": lambda: _config(
        "Mamba2Config",
        vocab_size=160,
        hidden_size=32,
        state_size=8,
        num_hidden_layers=2,
        conv_kernel=4,
        expand=2,
        head_dim=16,
        num_heads=4,
        n_groups=2,
        chunk_size=4,
    ),
    # a hybrid: layer 0 Mamba2 (Bamba's mixer), layer 1 attention with GQA and rotary
    "bamba": lambda: _config(
        "BambaConfig",
        vocab_size=160,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_layer_indices=[1],
        mamba_n_heads=4,
        mamba_d_head=16,
        mamba_n_groups=1,
        mamba_d_state=8,
        mamba_chunk_size=4,
        max_position_embeddings=128,
    ),
    # Jamba: Mamba layers with dt/B/C norms (layer 0) and attention (layer 1), MoE on layer 1
    "jamba": lambda: _config(
        "JambaConfig",
        vocab_size=160,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=1,
        num_experts=4,
        num_experts_per_tok=2,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_dt_rank=4,
        use_mamba_kernels=False,
        max_position_embeddings=128,
    ),
    # every layer attention and a Mamba2 mixer in parallel, with µP multipliers away from 1 (each
    # one moves the logits) and the gated RMS norm over 2 groups
    "falcon_h1": lambda: _config(
        "FalconH1Config",
        vocab_size=160,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        mamba_d_ssm=64,
        mamba_n_heads=4,
        mamba_n_groups=2,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_chunk_size=4,
        mamba_rms_norm=True,
        mamba_norm_before_gate=False,
        max_position_embeddings=128,
        embedding_multiplier=1.5,
        lm_head_multiplier=0.7,
        mlp_multipliers=[0.8, 1.3],
        key_multiplier=0.6,
        attention_in_multiplier=1.2,
        attention_out_multiplier=0.9,
        ssm_multipliers=[1.1, 0.9, 1.2, 0.8, 1.3],
        ssm_in_multiplier=1.25,
        ssm_out_multiplier=0.75,
    ),
    # gated delta net (layer 0, grouped: 4 value heads on 2 key heads) + gated attention with
    # partial rotary (layer 1), mixture-of-experts MLPs with a shared expert
    "qwen3_next": lambda: _config(
        "Qwen3NextConfig",
        vocab_size=160,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        linear_num_value_heads=4,
        linear_num_key_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=32,
        max_position_embeddings=128,
    ),
}


def build_ssm(name: str, seed: int = 0) -> Any:
    return from_config(SSM_CONFIGS[name](), seed, std=0.3, keep=("A_log",))


def greedy(model: Any, prompt: torch.Tensor, n: int) -> list[int]:
    """HF ``generate(do_sample=False)``: the reference token ids."""
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=n, do_sample=False, min_new_tokens=n)
    return out[0, prompt.shape[1] :].tolist()


def tokenizer_json(vocab: int) -> str:
    """A word-level ``tokenizer.json`` (tokenizers library) with ids 0..vocab-1."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = {f"w{i}": i for i in range(vocab)}
    tokenizer = Tokenizer(models.WordLevel(vocab=words, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer.to_str()

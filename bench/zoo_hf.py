"""The zoo's tiny ``transformers`` models: random weights from configs, never the hub."""

from __future__ import annotations

import os

import torch
from torch import nn

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

Inputs = tuple[torch.Tensor, ...]


class HFLastHidden(nn.Module):
    """A tensor-in, tensor-out wrapper (every exporter wants plain tensors)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).last_hidden_state


def _hf(kind: str) -> tuple[nn.Module, Inputs]:
    import transformers as tf

    small = {"vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    if kind == "bert":
        model = tf.BertModel(
            tf.BertConfig(**small, intermediate_size=128, max_position_embeddings=64), add_pooling_layer=False
        )
    elif kind == "gpt2":
        model = tf.GPT2Model(
            tf.GPT2Config(
                vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0
            )
        )
    elif kind == "llama":
        model = tf.LlamaModel(
            tf.LlamaConfig(**small, intermediate_size=128, num_key_value_heads=2, max_position_embeddings=64)
        )
    elif kind == "qwen2":
        model = tf.Qwen2Model(
            tf.Qwen2Config(**small, intermediate_size=128, num_key_value_heads=2, max_position_embeddings=64)
        )
    else:
        raise ValueError(kind)
    return HFLastHidden(model), (torch.randint(0, 256, (1, 16)),)


def hf_bert() -> tuple[nn.Module, Inputs]:
    return _hf("bert")


def hf_gpt2() -> tuple[nn.Module, Inputs]:
    return _hf("gpt2")


def hf_llama() -> tuple[nn.Module, Inputs]:
    return _hf("llama")


def hf_qwen2() -> tuple[nn.Module, Inputs]:
    return _hf("qwen2")


class HFEncoder(nn.Module):
    """An encoder taking one tensor under its own keyword (pixels, audio, mel features, ids)."""

    def __init__(self, model: nn.Module, keyword: str) -> None:
        super().__init__()
        self.model, self.keyword = model, keyword

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(**{self.keyword: x}).last_hidden_state


_ENC = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}


def hf_vit() -> tuple[nn.Module, Inputs]:
    import transformers as tf

    config = tf.ViTConfig(**_ENC, image_size=32, patch_size=8)
    return HFEncoder(tf.ViTModel(config, add_pooling_layer=False), "pixel_values"), (
        torch.randn(1, 3, 32, 32),
    )


def hf_whisper_encoder() -> tuple[nn.Module, Inputs]:
    import transformers as tf

    config = tf.WhisperConfig(
        d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128, num_mel_bins=16,
        max_source_positions=32, decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=128,
    )  # fmt: skip
    encoder = tf.WhisperModel(config).get_encoder()
    return HFEncoder(encoder, "input_features"), (torch.randn(1, 16, 64),)


def hf_wav2vec2() -> tuple[nn.Module, Inputs]:
    import transformers as tf

    config = tf.Wav2Vec2Config(
        **_ENC, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, do_stable_layer_norm=False, feat_extract_norm="group",
    )  # fmt: skip
    return HFEncoder(tf.Wav2Vec2Model(config), "input_values"), (torch.randn(1, 1600),)


def hf_electra() -> tuple[nn.Module, Inputs]:
    import transformers as tf

    config = tf.ElectraConfig(vocab_size=256, embedding_size=32, max_position_embeddings=64, **_ENC)
    return HFEncoder(tf.ElectraModel(config), "input_ids"), (torch.randint(0, 256, (1, 16)),)


def hf_t5_encoder() -> tuple[nn.Module, Inputs]:
    import transformers as tf

    config = tf.T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
    return HFEncoder(tf.T5EncoderModel(config), "input_ids"), (torch.randint(0, 256, (1, 16)),)

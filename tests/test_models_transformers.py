"""Tiny random Hugging Face ``transformers`` models: export, run in tract, match PyTorch (≤ 1e-4).

Models are built from configs (random weights, no hub access). Each wrapper takes and returns
plain tensors, with caches off. A model whose graph still needs ops without a rule is skipped
with the list of those ops, so the missing coverage is visible; so is a model torch.fx cannot
trace symbolically (the fx front end only); any other failure fails.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn

from tests.conftest import export_and_check
from torchlower.errors import TraceError, UnsupportedOpsError

os.environ.setdefault("HF_HUB_OFFLINE", "1")
transformers = pytest.importorskip("transformers")

SMALL = {"vocab_size": 99, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
SEQ = 7


class TextModel(nn.Module):
    """``(input_ids, attention_mask) -> logits or last hidden state``."""

    def __init__(self, model: nn.Module, cache: bool = True) -> None:
        super().__init__()
        self.model = model
        self.options = {"use_cache": False} if cache else {}  # encoders have no cache argument

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, return_dict=True, **self.options)
        logits = getattr(out, "logits", None)
        return logits if logits is not None else out.last_hidden_state


class EncoderModel(nn.Module):
    """``features -> last hidden state`` for vision / audio encoders."""

    def __init__(self, model: nn.Module, argument: str) -> None:
        super().__init__()
        self.model, self.argument = model, argument

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.model(**{self.argument: features}, return_dict=True).last_hidden_state


def text_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, SMALL["vocab_size"], (2, SEQ))
    mask = torch.ones(2, SEQ, dtype=torch.long)
    mask[1, SEQ - 2 :] = 0  # right padding on the second sequence
    return ids, mask


def bert() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    config = transformers.BertConfig(**SMALL, intermediate_size=37, max_position_embeddings=64)
    return TextModel(transformers.BertModel(config)), text_inputs()


def distilbert() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    config = transformers.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37)
    return TextModel(transformers.DistilBertModel(config)), text_inputs()


def gpt2() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    config = transformers.GPT2Config(
        vocab_size=99, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2
    )
    return TextModel(transformers.GPT2LMHeadModel(config)), text_inputs()


def _decoder(config_cls: str, model_cls: str) -> Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]:
    def build() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        config = getattr(transformers, config_cls)(
            **SMALL, intermediate_size=37, num_key_value_heads=2, max_position_embeddings=64
        )
        return TextModel(getattr(transformers, model_cls)(config)), text_inputs()

    return build


def vit() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    config = transformers.ViTConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        image_size=16, patch_size=4, num_channels=3,
    )  # fmt: skip
    return EncoderModel(transformers.ViTModel(config), "pixel_values"), (torch.randn(2, 3, 16, 16),)


def whisper_encoder() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    config = transformers.WhisperConfig(
        vocab_size=99, d_model=32, encoder_layers=2, encoder_attention_heads=4, decoder_layers=1,
        decoder_attention_heads=4, encoder_ffn_dim=37, decoder_ffn_dim=37, num_mel_bins=8,
        max_source_positions=12, pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1,
    )  # fmt: skip
    encoder = transformers.WhisperModel(config).get_encoder()
    return EncoderModel(encoder, "input_features"), (torch.randn(2, 8, 24),)


def t5_encoder() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    config = transformers.T5Config(vocab_size=99, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4)
    return TextModel(transformers.T5EncoderModel(config), cache=False), text_inputs()


def wav2vec2() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    config = transformers.Wav2Vec2Config(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=4, do_stable_layer_norm=False,
    )  # fmt: skip
    return EncoderModel(transformers.Wav2Vec2Model(config), "input_values"), (torch.randn(2, 400),)


MODELS = {
    "bert": bert,
    "distilbert": distilbert,
    "gpt2": gpt2,
    "llama": _decoder("LlamaConfig", "LlamaForCausalLM"),
    "qwen2": _decoder("Qwen2Config", "Qwen2ForCausalLM"),
    "mistral": _decoder("MistralConfig", "MistralForCausalLM"),
    "vit": vit,
    "whisper_encoder": whisper_encoder,
    "t5_encoder": t5_encoder,
    "wav2vec2": wav2vec2,
}


@pytest.mark.parametrize("name", list(MODELS))
def test_transformers_model(tmp_path, frontend, name):
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, args = MODELS[name]()
    # transformers skips an all-ones attention mask (masking_utils: `padding_mask.all()`) only when
    # not tracing; the jit front end's value witness takes the traced path too, so no opt-in
    try:
        report = export_and_check(model.eval(), args, tmp_path, frontend, tolerance=1e-4)
    except UnsupportedOpsError as exc:
        pytest.skip(f"{name}: ops without a rule yet: {', '.join(o.op for o in exc.ops)}")
    except TraceError as exc:
        if frontend != "fx":
            raise
        # transformers models branch on tensor values / shapes: torch.fx symbolic tracing cannot follow
        pytest.skip(f"{name}: not symbolically traceable by torch.fx ({str(exc)[:120]})")
    assert report.max_abs_error <= 1e-4


def test_a_returned_kv_cache_is_refused_with_the_way_out(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A bare ``GPT2Model`` returns its DynamicCache: the error says use_cache=False or llm.export,
    and leaves no file."""
    import torchlower
    from torchlower.errors import InvalidArgumentError

    torch.manual_seed(0)
    model = transformers.GPT2Model(transformers.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=99))
    with pytest.raises(InvalidArgumentError, match=r"DynamicCache.*use_cache=False.*torchlower\.llm\.export"):
        torchlower.export(model.eval(), (torch.randint(0, 99, (1, 5)),), tmp_path / "g.nnef.tgz")
    assert not (tmp_path / "g.nnef.tgz").exists()

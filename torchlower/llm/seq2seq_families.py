"""Which parts and sizes a speech encoder-decoder has, by ``model_type`` (Whisper, Speech2Text,
Moonshine): the layout of its archives, its decoder's position bound, its two part modules."""

from __future__ import annotations

from torch import nn

from torchlower.llm.seq2seq_moonshine import MoonshineDecoderPart, moonshine_layout
from torchlower.llm.seq2seq_parts import (
    DecoderPart,
    EncoderPart,
    Seq2SeqLayout,
    Speech2TextDecoderPart,
    conv_length,
)


def layout_of(model: nn.Module) -> Seq2SeqLayout:
    config = model.config
    encoder = model.model.encoder
    attn = model.model.decoder.layers[0].encoder_attn
    sizes = {
        "layers": len(model.model.decoder.layers),
        "heads": int(attn.k_proj.out_features // attn.head_dim),  # key/value heads: the cache's
        "head_dim": int(attn.head_dim),
        "vocab": int(config.vocab_size),
    }
    if config.model_type == "moonshine":
        return moonshine_layout(model, sizes)
    if config.model_type == "speech_to_text":
        convs = list(encoder.conv.conv_layers)
        # the sinusoidal table's rows past padding_idx: HF's cached decoding reads no further
        positions = int(encoder.embed_positions.weights.shape[0]) - 1 - int(encoder.padding_idx)
        max_source = min(int(config.max_source_positions), positions)
        max_frames = max_source * 2 ** len(convs)  # every conv halves (rounding up): ceil(T / 2**n)
        frames = min(max_frames, 50)
        return Seq2SeqLayout(
            **sizes, frames=frames, mels=int(config.input_feat_per_channel * config.input_channels),
            source=conv_length(convs, frames), time_axis=1, min_frames=1, max_frames=max_frames,
            max_source=conv_length(convs, max_frames),
        )  # fmt: skip
    frames = config.max_source_positions * encoder.conv1.stride[0] * encoder.conv2.stride[0]
    return Seq2SeqLayout(
        **sizes, frames=int(frames), mels=int(config.num_mel_bins), source=int(config.max_source_positions)
    )


def context_limit(model: nn.Module) -> tuple[int, str]:
    """The decoder's positions: the smaller of ``max_target_positions`` and its table's rows."""
    decoder = model.model.decoder
    if model.config.model_type == "moonshine":  # rotary positions: the config's bound alone
        return int(model.config.max_position_embeddings), "rotary positions"
    limit = int(model.config.max_target_positions)
    if model.config.model_type == "speech_to_text":
        rows = int(decoder.embed_positions.weights.shape[0])
        return min(limit, rows - 1 - int(decoder.padding_idx)), f"a {rows}-row sinusoidal table"
    rows = int(decoder.embed_positions.num_embeddings)
    return min(limit, rows), f"a {rows}-row position table"


def parts(model: nn.Module, layout: Seq2SeqLayout) -> tuple[nn.Module, nn.Module]:
    """The encoder and decoder parts of ``model`` (its family's decoder)."""
    decoder: type[DecoderPart] = DecoderPart
    if model.config.model_type == "speech_to_text":
        decoder = Speech2TextDecoderPart
    elif model.config.model_type == "moonshine":
        decoder = MoonshineDecoderPart
    return EncoderPart(model, layout).eval(), decoder(model, layout).eval()

"""The benchmark zoo: ~30 small models built in code (no downloads), one per ``Case``.

Every exporter builds its model from here with the same seed, so all of them see identical
weights and inputs. Sizes are chosen so one inference takes well under 10 ms single-threaded.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from bench.zoo_hf import (
    hf_bert,
    hf_electra,
    hf_gpt2,
    hf_llama,
    hf_qwen2,
    hf_t5_encoder,
    hf_vit,
    hf_wav2vec2,
    hf_whisper_encoder,
)

Inputs = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class Case:
    name: str
    family: str
    build: Callable[[], tuple[nn.Module, Inputs]]
    quick: bool = False  # part of the --quick subset


def _seeded(fn: Callable[[], tuple[nn.Module, Inputs]]) -> Callable[[], tuple[nn.Module, Inputs]]:
    def build() -> tuple[nn.Module, Inputs]:
        torch.manual_seed(0)
        model, args = fn()
        _randomize_norm_stats(model)
        return model.eval(), args

    build.__name__ = fn.__name__
    return build


def _randomize_norm_stats(model: nn.Module) -> None:
    """Non-trivial running statistics, so a dropped batch-norm shows up as an error."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)


# ---- MLPs ------------------------------------------------------------------------------------
def mlp_small() -> tuple[nn.Module, Inputs]:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10)), (torch.randn(1, 64),)


def mlp_deep() -> tuple[nn.Module, Inputs]:
    layers: list[nn.Module] = []
    for _ in range(8):
        layers += [nn.Linear(256, 256), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(256, 16)), (torch.randn(4, 256),)


def mlp_wide() -> tuple[nn.Module, Inputs]:
    return nn.Sequential(nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512)), (torch.randn(8, 512),)


class ResidualMLP(nn.Module):
    def __init__(self, dim: int = 128, blocks: int = 4) -> None:
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(blocks))
        self.ups = nn.ModuleList(nn.Linear(dim, 4 * dim) for _ in range(blocks))
        self.downs = nn.ModuleList(nn.Linear(4 * dim, dim) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm, up, down in zip(self.norms, self.ups, self.downs, strict=True):
            x = x + down(F.silu(up(norm(x))))
        return x


def mlp_residual() -> tuple[nn.Module, Inputs]:
    return ResidualMLP(), (torch.randn(2, 16, 128),)


# ---- 2-D CNNs --------------------------------------------------------------------------------
def _cbr(
    cin: int, cout: int, stride: int = 1, groups: int = 1, act: type[nn.Module] = nn.ReLU
) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride, 1, groups=groups, bias=False), nn.BatchNorm2d(cout), act()
    )


def cnn_classifier() -> tuple[nn.Module, Inputs]:
    model = nn.Sequential(
        _cbr(3, 16), nn.MaxPool2d(2), _cbr(16, 32), nn.MaxPool2d(2), _cbr(32, 64),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )  # fmt: skip
    return model, (torch.randn(1, 3, 32, 32),)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = (
            nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
            if stride != 1 or cin != cout
            else nn.Identity()
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + self.short(x))


def resnet_small() -> tuple[nn.Module, Inputs]:
    model = nn.Sequential(
        _cbr(3, 16), BasicBlock(16, 16, 1), BasicBlock(16, 32, 2), BasicBlock(32, 64, 2),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )  # fmt: skip
    return model, (torch.randn(1, 3, 32, 32),)


def _dw_sep(cin: int, cout: int, stride: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cin, 3, stride, 1, groups=cin, bias=False), nn.BatchNorm2d(cin), nn.ReLU6(),
        nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout), nn.Hardswish(),
    )  # fmt: skip


def mobilenet_like() -> tuple[nn.Module, Inputs]:
    model = nn.Sequential(
        _cbr(3, 16, 2, act=nn.Hardswish), _dw_sep(16, 32, 1), _dw_sep(32, 64, 2), _dw_sep(64, 64, 1),
        _dw_sep(64, 128, 2), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(128, 10),
    )  # fmt: skip
    return model, (torch.randn(1, 3, 64, 64),)


def vgg_ish() -> tuple[nn.Module, Inputs]:
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
        nn.MaxPool2d(2), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 32, 3, padding=1),
        nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 128), nn.ReLU(), nn.Dropout(), nn.Linear(128, 10),
    )  # fmt: skip
    return model, (torch.randn(1, 3, 32, 32),)


class UNetTiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.enc1, self.enc2 = _cbr(3, 16), _cbr(16, 32, 2)
        self.mid = _cbr(32, 32)
        self.up = nn.ConvTranspose2d(32, 16, 2, stride=2)
        self.dec = _cbr(32, 16)
        self.head = nn.Conv2d(16, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.enc1(x)
        b = self.mid(self.enc2(a))
        return self.head(self.dec(torch.cat([self.up(b), a], dim=1)))


def unet_tiny() -> tuple[nn.Module, Inputs]:
    return UNetTiny(), (torch.randn(1, 3, 32, 32),)


def cnn_groupnorm() -> tuple[nn.Module, Inputs]:
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.SiLU(),
        nn.Conv2d(32, 32, 3, padding=1), nn.GroupNorm(8, 32), nn.SiLU(), nn.AvgPool2d(2),
    )  # fmt: skip
    return model, (torch.randn(1, 3, 32, 32),)


class SqueezeExcite(nn.Module):
    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.conv = _cbr(3, c)
        self.fc1, self.fc2 = nn.Conv2d(c, c // 4, 1), nn.Conv2d(c // 4, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        s = torch.sigmoid(self.fc2(F.relu(self.fc1(y.mean(dim=(2, 3), keepdim=True)))))
        return y * s


def squeeze_excite() -> tuple[nn.Module, Inputs]:
    return SqueezeExcite(), (torch.randn(1, 3, 32, 32),)


class Upsampler(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.interpolate(F.relu(self.a(x)), scale_factor=2, mode="nearest")
        return F.interpolate(self.b(y), scale_factor=2, mode="bilinear", align_corners=False)


def upsample_interp() -> tuple[nn.Module, Inputs]:
    return Upsampler(), (torch.randn(1, 3, 16, 16),)


def pixel_shuffle() -> tuple[nn.Module, Inputs]:
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.PReLU(), nn.Conv2d(32, 12, 3, padding=1), nn.PixelShuffle(2)
    )
    return model, (torch.randn(1, 3, 24, 24),)


# ---- 1-D convolutions ------------------------------------------------------------------------
class TCN(nn.Module):
    def __init__(self, c: int = 32, levels: int = 4) -> None:
        super().__init__()
        self.inp = nn.Conv1d(8, c, 1)
        self.convs = nn.ModuleList(nn.Conv1d(c, c, 3, dilation=2**i) for i in range(levels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for conv in self.convs:
            pad = conv.dilation[0] * 2
            x = x + F.relu(conv(F.pad(x, (pad, 0))))
        return x


def conv1d_tcn() -> tuple[nn.Module, Inputs]:
    return TCN(), (torch.randn(1, 8, 128),)


def conv1d_audio() -> tuple[nn.Module, Inputs]:
    model = nn.Sequential(
        nn.Conv1d(1, 16, 9, stride=4, padding=4), nn.BatchNorm1d(16), nn.ReLU(),
        nn.Conv1d(16, 32, 5, stride=2, padding=2), nn.BatchNorm1d(32), nn.ReLU(), nn.MaxPool1d(2),
        nn.Conv1d(32, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(64, 12),
    )  # fmt: skip
    return model, (torch.randn(2, 1, 1024),)


class GatedConv(nn.Module):
    def __init__(self, c: int = 32) -> None:
        super().__init__()
        self.filt, self.gate, self.out = (
            nn.Conv1d(c, c, 3, padding=1),
            nn.Conv1d(c, c, 3, padding=1),
            nn.Conv1d(c, c, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.out(torch.tanh(self.filt(x)) * torch.sigmoid(self.gate(x)))


def conv1d_gated() -> tuple[nn.Module, Inputs]:
    return nn.Sequential(GatedConv(), GatedConv(), GatedConv()), (torch.randn(1, 32, 200),)


def conv1d_autoencoder() -> tuple[nn.Module, Inputs]:
    model = nn.Sequential(
        nn.Conv1d(4, 16, 4, stride=2, padding=1), nn.ELU(),
        nn.Conv1d(16, 32, 4, stride=2, padding=1), nn.ELU(),
        nn.ConvTranspose1d(32, 16, 4, stride=2, padding=1), nn.ELU(),
        nn.ConvTranspose1d(16, 4, 4, stride=2, padding=1),
    )  # fmt: skip
    return model, (torch.randn(1, 4, 64),)


# ---- recurrent -------------------------------------------------------------------------------
class RNNHead(nn.Module):
    def __init__(self, rnn: nn.Module, hidden: int) -> None:
        super().__init__()
        self.rnn, self.head = rnn, nn.Linear(hidden, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(x)
        return self.head(y)


def lstm_1layer() -> tuple[nn.Module, Inputs]:
    return RNNHead(nn.LSTM(32, 64, batch_first=True), 64), (torch.randn(1, 20, 32),)


def lstm_2layer_bidir() -> tuple[nn.Module, Inputs]:
    return RNNHead(nn.LSTM(32, 48, num_layers=2, bidirectional=True, batch_first=True), 96), (
        torch.randn(1, 16, 32),
    )


def gru_2layer() -> tuple[nn.Module, Inputs]:
    return RNNHead(nn.GRU(32, 64, num_layers=2, batch_first=True), 64), (torch.randn(1, 20, 32),)


def rnn_tanh() -> tuple[nn.Module, Inputs]:
    return RNNHead(nn.RNN(16, 32, batch_first=True), 32), (torch.randn(1, 24, 16),)


# ---- attention -------------------------------------------------------------------------------
def transformer_encoder() -> tuple[nn.Module, Inputs]:
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), (torch.randn(1, 16, 64),)


class SelfAttention(nn.Module):
    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.mha = nn.MultiheadAttention(dim, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mha(x, x, x, need_weights=False)[0]


def multihead_attention() -> tuple[nn.Module, Inputs]:
    return SelfAttention(), (torch.randn(1, 16, 64),)


class ViTTiny(nn.Module):
    def __init__(self, dim: int = 64) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 8, 8)
        self.cls = nn.Parameter(torch.randn(1, 1, dim))
        self.pos = nn.Parameter(torch.randn(1, 17, dim) * 0.02)
        layer = nn.TransformerEncoderLayer(
            dim, 4, 2 * dim, dropout=0.0, activation="gelu", batch_first=True, norm_first=True
        )
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.patch(x).flatten(2).transpose(1, 2)
        y = self.enc(torch.cat([self.cls.expand(x.shape[0], -1, -1), p], dim=1) + self.pos)
        return self.head(y[:, 0])


def vit_tiny() -> tuple[nn.Module, Inputs]:
    return ViTTiny(), (torch.randn(1, 3, 32, 32),)


class CausalAttention(nn.Module):
    """Hand-written attention: matmuls, scaling, a causal mask, softmax."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.qkv(x).reshape(b, s, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) / (d // self.heads) ** 0.5
        mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        return self.out((att @ v).transpose(1, 2).reshape(b, s, d))


def causal_attention() -> tuple[nn.Module, Inputs]:
    return CausalAttention(), (torch.randn(1, 16, 64),)


# ---- misc ------------------------------------------------------------------------------------
class TextClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.fc = nn.Embedding(1000, 64), nn.Linear(64, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.fc(self.emb(ids).mean(dim=1))


def embedding_classifier() -> tuple[nn.Module, Inputs]:
    return TextClassifier(), (torch.randint(0, 1000, (2, 32)),)


class Pointwise(nn.Module):
    """A chain of elementwise ops and reductions, the glue of real models."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.clamp(x, min=-2.0, max=2.0) * 0.5 + 1.0
        y = torch.where(y > 1.0, torch.exp(-y), torch.sin(y)) + torch.sqrt(y.abs() + 1e-3)
        y = y.pow(2) - torch.log1p(y.abs())
        return torch.softmax(y, dim=-1) + y.amax(dim=-1, keepdim=True)


def pointwise_chain() -> tuple[nn.Module, Inputs]:
    return Pointwise(), (torch.randn(4, 64, 32),)


_QUICK = {"mlp_small", "cnn_classifier", "lstm_1layer", "transformer_encoder", "hf_bert"}
_FAMILY = {
    "mlp": [mlp_small, mlp_deep, mlp_wide, mlp_residual],
    "cnn": [cnn_classifier, resnet_small, mobilenet_like, vgg_ish, unet_tiny, cnn_groupnorm, squeeze_excite,
            upsample_interp, pixel_shuffle],
    "conv1d": [conv1d_tcn, conv1d_audio, conv1d_gated, conv1d_autoencoder],
    "rnn": [lstm_1layer, lstm_2layer_bidir, gru_2layer, rnn_tanh],
    "attention": [transformer_encoder, multihead_attention, vit_tiny, causal_attention],
    "misc": [embedding_classifier, pointwise_chain],
    "transformers": [hf_bert, hf_gpt2, hf_llama, hf_qwen2, hf_vit, hf_whisper_encoder, hf_wav2vec2,
                     hf_electra, hf_t5_encoder],
}  # fmt: skip
ZOO: dict[str, Case] = {
    fn.__name__: Case(fn.__name__, family, _seeded(fn), fn.__name__ in _QUICK)
    for family, fns in _FAMILY.items()
    for fn in fns
}


def wide_mlp(weight_bytes: int = 1 << 30, width: int = 8192) -> tuple[nn.Module, Inputs]:
    """A bias-free MLP holding about ``weight_bytes`` of f32 weights (for the memory test)."""
    layers = max(1, round(weight_bytes / (4 * width * width)))
    model = nn.Sequential(*(nn.Linear(width, width, bias=False, device="meta") for _ in range(layers)))
    model.to_empty(device="cpu")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-(width**-0.5), width**-0.5, generator=gen)
    return model.eval(), (torch.randn(1, width, generator=gen),)

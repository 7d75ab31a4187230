"""Small models shared by the precision, compression and quantization tests."""

from __future__ import annotations

import itertools

import torch
from torch import nn


class MLP(nn.Sequential):
    def __init__(self, sizes: tuple[int, ...] = (64, 128, 96, 32)) -> None:
        layers: list[nn.Module] = []
        for i, (a, c) in enumerate(itertools.pairwise(sizes)):
            layers += [nn.Linear(a, c)] + ([nn.ReLU()] if i < len(sizes) - 2 else [])
        super().__init__(*layers)


class CNN(nn.Module):
    """conv (reduced size 8·2·2 = 32: compressible), conv (3·3·3 = 27: not), pool, linear."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.body = nn.Conv2d(8, 16, 2, stride=2)
        self.head = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.body(torch.relu(self.stem(x))))
        return self.head(torch.flatten(x, 1))


class Block(nn.Module):
    """Attention + MLP with hand-written layer norms (mean/var), softmax and residuals."""

    def __init__(self, d: int = 64) -> None:
        super().__init__()
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.up = nn.Linear(d, 2 * d)
        self.down = nn.Linear(2 * d, d)
        self.proj = nn.Parameter(torch.randn(d, d) / d**0.5)  # matmul by a constant

    @staticmethod
    def norm(x: torch.Tensor) -> torch.Tensor:
        mu = x.mean(-1, keepdim=True)
        var = ((x - mu) ** 2).mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt(var + 1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        att = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
        x = x + self.out(att @ v)
        x = x + self.down(torch.relu(self.up(self.norm(x))))
        return x @ self.proj

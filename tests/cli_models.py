"""Model factories the CLI tests import as ``tests.cli_models:NAME`` (real modules, real weights)."""

from __future__ import annotations

import torch
from torch import nn


def mlp() -> nn.Module:
    """Two linear layers with a relu: within every front end's coverage."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).eval()


class TwoHeads(nn.Module):
    """Two inputs, two outputs: names and order must survive the round trip."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.a = nn.Linear(6, 3)
        self.b = nn.Linear(5, 2)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.relu(self.a(x)), self.b(y)


class Determinant(nn.Module):
    """Uses ``linalg_det``, which no rule lowers (exercises exit code 3)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.linalg.det(x)


def broken() -> nn.Module:
    raise RuntimeError("factory exploded on purpose")


def encoder2() -> nn.Module:
    """A 2-layer transformer encoder (d=16, 2 heads): the grouped picture has one cluster per layer."""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.0, batch_first=True)
    return nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()


class DataDependent(nn.Module):
    """A data-dependent branch: torch.export refuses it and prints a partial graph to stderr."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = 2.0 if bool(x.sum() > -1e9) else 3.0
        return self.proj(x) * scale


def q4_mlp() -> nn.Module:
    """Linear layers whose weights Q4_0 compresses (sizes multiples of 32), seeded: the same
    weights in every process, so ``check --model`` sees the model the archive came from."""
    from tests.models_compress import MLP

    torch.manual_seed(3)
    return MLP().eval()


class Drifting(nn.Module):
    """Multiplies by how often it was called: the traced graph can never match a later call, so
    every export's check fails (a CheckError the CLI reports with exit 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * float(self.calls)

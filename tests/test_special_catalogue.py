"""The special-values catalogue of issue 32, through the three front ends.

Masked softmax with fully masked (empty) rows, amax over NaN rows, log-sigmoid at -40 and
attention under a padding mask of -inf: each is exported with ``check="special"`` at an example
that holds those values, and then run in tract at that example; tract's outputs must equal
torch's position by position (NaN where torch has NaN, the same infinity), or the check refuses
the export — never a ✓ on a different number.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchlower
from torchlower.errors import CheckError

INF, NAN = float("inf"), float("nan")


class MaskedSoftmax(nn.Module):
    def forward(self, scores: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return scores.masked_fill(~keep, -INF).softmax(-1)


class AmaxRows(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x.amax(-1), x.amax(-1, keepdim=True) - x.amin(-1, keepdim=True)


class LogSigmoid(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.logsigmoid(x), torch.log(torch.sigmoid(x))


class PaddedAttention(nn.Module):
    """Scores plus an additive padding mask of 0 / -inf, by hand and through SDPA."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        weights = (q @ k.transpose(-1, -2) / 2.0 + mask).softmax(-1)
        return weights @ v, F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _keep() -> torch.Tensor:
    keep = torch.rand(2, 3, 5) > 0.3
    keep[0, 1] = False  # an empty row: torch's softmax is NaN there
    keep[1, 2] = True
    return keep


def _mask() -> torch.Tensor:
    mask = torch.zeros(2, 1, 4, 4)
    mask[..., 3:] = -INF  # the last key is padding
    mask[1, 0, 2] = -INF  # a fully masked query row
    return mask


CATALOGUE = {
    "masked_softmax": (MaskedSoftmax, lambda: (torch.randn(2, 3, 5), _keep())),
    "amax_nan_rows": (
        AmaxRows,
        lambda: (torch.tensor([[1.0, NAN, 3.0], [NAN, NAN, NAN], [-INF, -INF, -INF]]),),
    ),
    "log_sigmoid_-40": (LogSigmoid, lambda: (torch.tensor([-40.0, -20.0, -80.0, -INF, 0.0, 30.0, NAN]),)),
    "padding_mask": (PaddedAttention, lambda: (*torch.randn(3, 2, 2, 4, 8).unbind(0), _mask())),
}
REFUSED: set[str] = set()  # none: every entry matches torch position by position


@pytest.mark.parametrize("name", sorted(CATALOGUE))
def test_matches_torch_position_by_position_or_is_refused(name: str, frontend: str, tmp_path: Path) -> None:
    make, inputs = CATALOGUE[name]
    torch.manual_seed(0)
    model, xs = make().eval(), inputs()
    path = tmp_path / "m.nnef.tgz"
    if name in REFUSED:
        with pytest.raises(CheckError, match=r"special values|tract disagrees"):
            torchlower.export(model, xs, path, frontend=frontend, check="special")
        return
    torchlower.export(model, xs, path, frontend=frontend, check="special")
    got = list(torchlower.load(path).run([x.numpy() for x in xs]).values())
    with torch.no_grad():
        want = model(*xs)
    for w, g in zip(want if isinstance(want, tuple) else (want,), got, strict=True):
        w = w.numpy()
        assert np.array_equal(np.isnan(w), np.isnan(g)), (name, w, g)
        assert np.array_equal(np.isinf(w), np.isinf(g)) and np.array_equal(w[np.isinf(w)], g[np.isinf(g)])
        finite = np.isfinite(w)
        np.testing.assert_allclose(g[finite], w[finite], rtol=2e-5, atol=1e-6)

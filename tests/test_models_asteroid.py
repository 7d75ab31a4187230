"""asteroid 0.7.0's separation models as shipped (issue 30's "Done when"), random weights, at
their real input shapes, exported through ``auto`` and checked in tract.

asteroid wraps its shape-dependent helpers in its own copy of ``@torch.jit.script_if_tracing``
(``_glob_norm``'s ``torch.arange(1, len(x.shape)).tolist()``, asteroid-filterbanks'
``multishape_conv1d`` branching on ``ndim``, ``jitable_shape``'s ``torch.tensor(x.shape)``).
torch.export refuses the ``tolist()`` (a value read from a tensor) and FX the branches on a
traced size, so ``auto`` takes the jit front end, which traces the helpers through as Python
(``frontends/script_inline.py``). ``DCCRNet`` cannot be built on torch 2.13: asteroid passes
``np.prod(...)`` (a numpy int64) as ``nn.LSTM``'s ``input_size``, which torch rejects
(``TypeError: input_size should be of type int, got: int64``); ``DCUNet`` is its complex-mask
sibling (STFT → complex U-Net mask → iSTFT).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import torchlower

models = pytest.importorskip("asteroid.models", reason="asteroid is not installed (requirements-nodeps.txt)")


def _build(name: str) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    if name == "ConvTasNet":  # a small configuration of the shipped class, 1 s at 8 kHz
        model = models.ConvTasNet(
            n_src=2, n_filters=64, bn_chan=32, hid_chan=64, skip_chan=32, n_blocks=2, n_repeats=2,
            sample_rate=8000,
        )  # fmt: skip
        return model.eval(), torch.randn(1, 8000)
    # the shipped DCUNet-10 architecture, half a second at 16 kHz (padded to its stride product)
    return models.DCUNet("DCUNet-10", sample_rate=16000, fix_length_mode="pad").eval(), torch.randn(1, 8000)


@pytest.mark.parametrize("name", ["ConvTasNet", "DCUNet"])
def test_asteroid_separation_model_through_auto(name: str, tmp_path: Path) -> None:
    model, wave = _build(name)
    report = torchlower.export(model, (wave,), tmp_path / "m.nnef.tgz")
    assert report.frontend == "jit", report.notes
    assert any(n.startswith("export front end skipped: ValueDependentTraceError") for n in report.notes)
    checked = [p for p in report.points if p.skipped is None]
    assert len(checked) >= 4 and all(p.ok for p in checked), report.points
    with torch.no_grad():
        scale = float(model(wave).abs().max())
    assert report.max_abs_error <= 1e-4 * max(1.0, scale), (report.max_abs_error, scale)
    assert report.outputs[0].shape[:2] == (1, 2 if name == "ConvTasNet" else 1)

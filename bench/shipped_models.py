"""Issue 30's "Done when", as a new user meets it: real package models at their real input shapes,
each exported through ``auto`` and checked in tract; one row per model.

    RAYON_NUM_THREADS=1 .venv/bin/python -m bench.shipped_models [--out bench/results-issue30.md]
    [--only NAME,NAME]

Prints a table: model, input shape, front end ``auto`` chose, whether every check point passed,
the max |torch − tract| over the points (and over the example's max |torch|), the export time
(capture + lowering + the check), and what ``auto`` noted (front ends skipped, bounds
adopted). Random weights everywhere except silero-vad (its shipped pretrained
``silero_vad.jit``); nothing is downloaded. A model whose package is missing or which cannot be
built is a row saying why. Single-threaded, with the load average printed: the export times
are wall times on a shared machine.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("RAYON_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from torch import nn

from tests import torchvision_shim

torchvision_shim.install_torchaudio()

import torchlower  # noqa: E402

Case = Callable[[], tuple[nn.Module, tuple[Any, ...], dict[str, Any]]]


def _torchaudio(name: str) -> Case:
    def build() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
        import torchaudio

        t = torchaudio.transforms
        model = {
            "Spectrogram": lambda: t.Spectrogram(),
            "MelSpectrogram": lambda: t.MelSpectrogram(16000, n_fft=400, hop_length=160, n_mels=80),
            "MFCC": lambda: t.MFCC(
                16000, n_mfcc=13, melkwargs={"n_fft": 400, "hop_length": 160, "n_mels": 40}
            ),
        }[name]()
        return model, (torch.randn(1, 16000),), {}

    return build


def _whisper() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    from tests.test_models_audio_frontends import OpenAIWhisperLogMel

    return OpenAIWhisperLogMel(), (torch.randn(1, 480000),), {}  # whisper pads every input to 30 s


def _whisper_dynamic() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    from tests.test_models_audio_frontends import OpenAIWhisperLogMel

    axes = {"dynamic_axes": {"waveform": {0: "B", 1: "T"}}, "input_names": ["waveform"]}
    return OpenAIWhisperLogMel(), (torch.randn(1, 16000),), axes


def _silero() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or spec.origin is None:
        raise RuntimeError("silero-vad is not installed")
    vad = torch.jit.load(str(Path(spec.origin).parent / "data" / "silero_vad.jit")).eval()
    # its 16 kHz network: 64 samples of context + 512 of audio, and the LSTM state
    return vad._model, (torch.randn(1, 576) * 0.1, torch.zeros(2, 1, 128)), {"input_names": ["x", "state"]}


def _asteroid(name: str) -> Case:
    def build() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
        import asteroid.models as m

        model = {
            "ConvTasNet": lambda: m.ConvTasNet(n_src=2, sample_rate=8000),  # the paper's configuration
            "DPRNNTasNet": lambda: m.DPRNNTasNet(n_src=2, sample_rate=8000),
            "DCUNet": lambda: m.DCUNet("DCUNet-10", sample_rate=16000, fix_length_mode="pad"),
            "DCCRNet": lambda: m.DCCRNet("DCCRN-CL", sample_rate=16000),
        }[name]()
        rate = 8000 if name in ("ConvTasNet", "DPRNNTasNet") else 16000
        return model, (torch.randn(1, rate),), {}  # one second

    return build


def _dccrn_style() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    from tests.test_complex_views import ComplexMaskNet

    return ComplexMaskNet(), (torch.randn(1, 16000),), {}


def _kornia(name: str) -> Case:
    def build() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
        from tests import test_models_kornia_pyg as k

        model = {"warp_affine": k.WarpAffine, "warp_perspective": k.WarpPerspective}[name]()
        image = torch.rand(*k.IMAGE)
        return model, ((image, k.AFFINE) if name == "warp_affine" else (image,)), {}

    return build


def _pyg(name: str) -> Case:
    """Cora-sized: 2708 nodes with 1433 features, 10556 edges (some self loops), 7 classes."""

    def build() -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
        import torch_geometric as g

        class Net(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                if name == "GCN":
                    self.conv1, self.conv2 = g.nn.GCNConv(1433, 16), g.nn.GCNConv(16, 7)
                else:
                    self.conv1, self.conv2 = g.nn.GATConv(1433, 8, heads=8), g.nn.GATConv(64, 7)

            def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
                return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

        nodes, edges = 2708, 10556
        e = torch.randint(0, nodes, (2, edges))
        e[1, :100] = e[0, :100]
        return Net(), (torch.randn(nodes, 1433), e), {}

    return build


CASES: dict[str, Case] = {
    "torchaudio Spectrogram": _torchaudio("Spectrogram"),
    "torchaudio MelSpectrogram": _torchaudio("MelSpectrogram"),
    "torchaudio MFCC": _torchaudio("MFCC"),
    "openai-whisper log_mel_spectrogram": _whisper,
    "openai-whisper log_mel_spectrogram (B, T dynamic)": _whisper_dynamic,
    "silero-vad silero_vad.jit (16 kHz network)": _silero,
    "asteroid ConvTasNet": _asteroid("ConvTasNet"),
    "asteroid DPRNNTasNet": _asteroid("DPRNNTasNet"),
    "asteroid DCUNet-10": _asteroid("DCUNet"),
    "asteroid DCCRNet": _asteroid("DCCRNet"),
    "DCCRN-style complex mask (tests)": _dccrn_style,
    "kornia warp_affine": _kornia("warp_affine"),
    "kornia warp_perspective": _kornia("warp_perspective"),
    "torch-geometric GCN": _pyg("GCN"),
    "torch-geometric GAT": _pyg("GAT"),
}


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"[:160].replace("|", "/")


def run_case(name: str, build: Case, folder: Path) -> dict[str, Any]:
    torch.manual_seed(0)
    try:
        model, inputs, options = build()
    except Exception as exc:  # the package is missing or cannot build the model here
        return {"model": name, "shape": "", "frontend": "—", "verified": "not built", "error": "", "rel": "",
                "time": "", "notes": _first(exc)}  # fmt: skip
    shape = " ".join("×".join(map(str, t.shape)) for t in inputs)
    with torch.no_grad():  # the outputs' scale, so the error reads relative to it
        out = model.eval()(*inputs)
    scale = max(float(t.abs().max()) for t in ([out] if isinstance(out, torch.Tensor) else out))
    start = time.perf_counter()
    try:
        report = torchlower.export(
            model.eval(), inputs, folder / f"{len(os.listdir(folder))}.nnef.tgz", **options
        )
    except Exception as exc:
        return {"model": name, "shape": shape, "frontend": "—", "verified": "failed", "error": "", "rel": "",
                "time": f"{time.perf_counter() - start:.1f}", "notes": _first(exc)}  # fmt: skip
    elapsed = time.perf_counter() - start
    checked = [p for p in report.points if p.skipped is None]
    notes = [n for n in report.notes if "skipped" in n or "adopted" in n or n.startswith("fx: lowered")]
    return {
        "model": name, "shape": shape, "frontend": report.frontend,
        "verified": f"yes ({len(checked)} points)" if checked and all(p.ok for p in checked) else "NO",
        "error": f"{report.max_abs_error:.2e}", "time": f"{elapsed:.1f}",
        "rel": f"{report.max_abs_error / scale:.1e}" if scale > 0 else "",
        "notes": "; ".join(n[:140].replace("|", "/") for n in notes),
    }  # fmt: skip


def table(rows: list[dict[str, Any]]) -> str:
    keys = ("model", "shape", "frontend", "verified", "error", "rel", "time", "notes")
    head = "| model | input | front end | verified | max abs err | ÷ max abs torch | export s | notes |\n"
    head += "|---" * len(keys) + "|\n"
    return head + "".join("| " + " | ".join(str(r[k]) for k in keys) + " |\n" for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the table (markdown) here")
    parser.add_argument("--only", help="comma-separated substrings of model names")
    args = parser.parse_args()
    torch.set_num_threads(1)
    wanted = [s.strip().lower() for s in args.only.split(",")] if args.only else None
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, build in CASES.items():
            if wanted and not any(w in name.lower() for w in wanted):
                continue
            try:
                rows.append(run_case(name, build, Path(tmp)))
            except Exception:  # never lose the table to one model
                traceback.print_exc()
            print(table(rows[-1:]).splitlines()[-1], flush=True)
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else ["?"]
    text = f"{table(rows)}\nload average {' '.join(load)}; torch {torch.__version__}; 1 thread\n"
    print("\n" + text)
    if args.out:
        args.out.write_text(f"# Issue 30: shipped models through auto (bench/shipped_models.py)\n\n{text}")


if __name__ == "__main__":
    main()

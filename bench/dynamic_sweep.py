"""Real package models with their natural axes dynamic (issue 28): does ``torchlower.export``
verify them, through which front end, at which sizes, with what error?

Each model runs in its own process (a crash or a hang costs that model only), with random
weights and no hub download. Prints one line per model and writes ``bench/dynamic_sweep.json``.

    python -m bench.dynamic_sweep [--only NAME ...] [--timeout S] [--frontend auto]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.dynamic_speech_pkgs import PACKAGES  # noqa: E402


# ---- the catalogue: name → (family, build) with build() -> (model, example, dynamic_axes) --------
def _hf(
    config: str, model: str, example: Callable[[], Any], axes: dict[int, str], part: str = "", **fields: Any
) -> Callable:
    def build() -> tuple[Any, Any, dict]:
        import torch
        import transformers

        torch.manual_seed(0)
        cfg = getattr(transformers, config)(**fields)
        m = getattr(transformers, model)(cfg)
        return (getattr(m, part) if part else m).eval(), example(), {"x": axes}

    return build


def _wave(n: int = 16000) -> Callable[[], Any]:
    return lambda: __import__("torch").randn(1, n)


def _feats(t: int, f: int, channels_first: bool = False) -> Callable[[], Any]:
    import_torch = __import__("torch")
    return lambda: import_torch.randn(1, f, t) if channels_first else import_torch.randn(1, t, f)


TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
W2V = dict(TINY, conv_dim=(32,) * 7, num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4)

SPEECH: dict[str, Callable] = {
    "wav2vec2": _hf("Wav2Vec2Config", "Wav2Vec2Model", _wave(), {1: "T"}, **W2V),
    "hubert": _hf("HubertConfig", "HubertModel", _wave(), {1: "T"}, **W2V),
    "wavlm": _hf("WavLMConfig", "WavLMModel", _wave(), {1: "T"}, **W2V),
    "data2vec_audio": _hf("Data2VecAudioConfig", "Data2VecAudioModel", _wave(), {1: "T"}, **W2V),
    "sew": _hf("SEWConfig", "SEWModel", _wave(), {1: "T"}, **{**W2V, "conv_dim": (32,) * 13}),
    "sew_d": _hf("SEWDConfig", "SEWDModel", _wave(), {1: "T"}, **{**W2V, "conv_dim": (32,) * 13}),
    "unispeech": _hf("UniSpeechConfig", "UniSpeechModel", _wave(), {1: "T"}, **W2V),
    "unispeech_sat": _hf("UniSpeechSatConfig", "UniSpeechSatModel", _wave(), {1: "T"}, **W2V),
    "wav2vec2_conformer": _hf("Wav2Vec2ConformerConfig", "Wav2Vec2ConformerModel", _wave(), {1: "T"}, **W2V),
    "wav2vec2_bert": _hf(
        "Wav2Vec2BertConfig",
        "Wav2Vec2BertModel",
        _feats(50, 160),
        {1: "T"},
        **TINY,
        output_hidden_size=32,
        feature_projection_input_dim=160,
    ),  # fmt: skip
    "speech2text_encoder": _hf(
        "Speech2TextConfig",
        "Speech2TextModel",
        _feats(60, 80),
        {1: "T"},
        part="encoder",
        d_model=32,
        encoder_layers=2,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_source_positions=600,
    ),  # fmt: skip
    "parakeet_encoder": _hf(
        "ParakeetEncoderConfig",
        "ParakeetEncoder",
        _feats(120, 80),
        {1: "T"},
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
    ),  # fmt: skip
    "whisper_encoder": _hf(
        "WhisperConfig",
        "WhisperModel",
        _feats(3000, 80, channels_first=True),
        {2: "T"},
        part="encoder",
        d_model=32,
        encoder_layers=2,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
    ),  # fmt: skip
    "encodec": _hf(
        "EncodecConfig",
        "EncodecModel",
        lambda: __import__("torch").randn(1, 1, 4800),
        {2: "T"},
        hidden_size=32,
        num_filters=8,
        upsampling_ratios=[4, 4],
        codebook_size=64,
        codebook_dim=32,
    ),  # fmt: skip
    "ast": _hf("ASTConfig", "ASTModel", _feats(100, 32), {1: "T"}, **TINY, max_length=100, num_mel_bins=32),
}


def _tv(name: str, axes: dict[int, str], size: int = 224, **kw: Any) -> Callable:
    def build() -> tuple[Any, Any, dict]:
        import torch
        import torchvision

        torch.manual_seed(0)
        m, extra = getattr(torchvision.models, name, None), dict(kw)
        if m is None:  # segmentation models also fetch a backbone unless told not to
            m, extra = getattr(torchvision.models.segmentation, name), {**kw, "weights_backbone": None}
        return m(weights=None, **extra).eval(), torch.randn(1, 3, size, size), {"x": axes}

    return build


def _smp(arch: str, encoder: str, axes: dict[int, str]) -> Callable:
    def build() -> tuple[Any, Any, dict]:
        import segmentation_models_pytorch as smp
        import torch

        torch.manual_seed(0)
        m = getattr(smp, arch)(encoder, encoder_weights=None, classes=3).eval()
        return m, torch.randn(1, 3, 256, 256), {"x": axes}

    return build


def _yolo(yaml: str, axes: dict[int, str]) -> Callable:
    def build() -> tuple[Any, Any, dict]:
        import torch
        from ultralytics.nn.tasks import DetectionModel, SegmentationModel

        torch.manual_seed(0)
        kind = SegmentationModel if "-seg" in yaml else DetectionModel
        return kind(yaml, verbose=False).eval(), torch.randn(1, 3, 320, 320), {"x": axes}

    return build


BHW = {0: "B", 2: "H", 3: "W"}
B32HW = {0: "B", 2: "32*h", 3: "32*w"}
VISION: dict[str, Callable] = {
    "resnet18": _tv("resnet18", BHW),
    "mobilenet_v3_small": _tv("mobilenet_v3_small", BHW),
    "efficientnet_b0": _tv("efficientnet_b0", BHW),
    "fcn_resnet50": _tv("fcn_resnet50", B32HW, size=160, num_classes=3, aux_loss=False),
    "lraspp_mobilenet_v3": _tv("lraspp_mobilenet_v3_large", B32HW, num_classes=3),
    "deeplabv3_mobilenet": _tv("deeplabv3_mobilenet_v3_large", B32HW, size=160, num_classes=3),
    "smp_unet_resnet18": _smp("Unet", "resnet18", B32HW),
    "smp_fpn_resnet18": _smp("FPN", "resnet18", B32HW),
    "smp_deeplabv3plus": _smp("DeepLabV3Plus", "resnet18", B32HW),
    "smp_segformer_mit_b0": _smp("Segformer", "mit_b0", B32HW),
    "yolov8n": _yolo("yolov8n.yaml", B32HW),
    "yolo11n": _yolo("yolo11n.yaml", B32HW),
    "yolov8n_seg": _yolo("yolov8n-seg.yaml", B32HW),
}
CATALOGUE = {
    **{f"speech/{k}": v for k, v in SPEECH.items()},
    **{f"speech/{k}": v for k, v in PACKAGES.items()},
    **{f"vision/{k}": v for k, v in VISION.items()},
}


def run_one(name: str, frontend: str) -> dict[str, Any]:
    """In the child: build, export, check; the outcome as a dict."""
    sys.path.insert(0, str(ROOT))
    from tests import torchvision_shim

    torchvision_shim.install()
    import tempfile

    import torch

    import torchlower

    torch.set_num_threads(1)
    model, example, axes = CATALOGUE[name]()
    names = [f"in{i}" for i in range(len(example))] if isinstance(example, tuple) else ["x"]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            report = torchlower.export(
                model,
                example,
                Path(tmp) / "m.nnef.tgz",
                input_names=names,
                dynamic_axes=axes,
                frontend=frontend,
            )
        except Exception as exc:  # the outcome to record, typed or not
            text = str(exc).strip().splitlines()
            return {"name": name, "ok": False, "error": type(exc).__name__, "why": text[0][:400] if text else "",
                    "typed": isinstance(exc, torchlower.errors.TorchlowerError),
                    "seconds": round(time.perf_counter() - started, 1)}  # fmt: skip
    sizes = [p.label for p in report.points if "=" in p.label and p.skipped is None]
    return {
        "name": name, "ok": True, "frontend": report.frontend, "max_abs": report.max_abs_error,
        "sizes": sizes, "notes": report.notes, "seconds": round(time.perf_counter() - started, 1),
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--timeout", type=float, default=420)
    parser.add_argument("--frontend", default="auto")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=str(ROOT / "bench" / "dynamic_sweep.json"))
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_one(args.child, args.frontend)))
        return 0
    names = [n for n in CATALOGUE if not args.only or any(o in n for o in args.only)]
    results = []
    env = dict(
        os.environ, OMP_NUM_THREADS="1", RAYON_NUM_THREADS="1", TRACT_FLASH_SDPA_ST="1", HF_HUB_OFFLINE="1"
    )
    load = os.getloadavg()[0]
    for name in names:
        cmd = [sys.executable, "-m", "bench.dynamic_sweep", "--child", name, "--frontend", args.frontend]
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=args.timeout, env=env, cwd=ROOT
            )
            line = next((x for x in reversed(proc.stdout.splitlines()) if x.startswith("{")), None)
            result = json.loads(line) if line else {
                "name": name, "ok": False, "error": "crash", "why": proc.stderr.strip().splitlines()[-1:] or "",
                "typed": False,
            }  # fmt: skip
        except subprocess.TimeoutExpired:
            result = {
                "name": name,
                "ok": False,
                "error": "timeout",
                "why": f"> {args.timeout:.0f} s",
                "typed": False,
            }
        result["load"] = round(os.getloadavg()[0], 2)
        results.append(result)
        shown = (
            f"✓ {result['frontend']:6s} max abs {result['max_abs']:.2e} at {', '.join(result['sizes'])}"
            if result["ok"]
            else f"✗ {result['error']}: {result['why']}"
        )
        print(f"{name:34s} {shown}", flush=True)
    ok = sum(r["ok"] for r in results)
    print(f"{ok} of {len(results)} verified (frontend={args.frontend}; load average at start {load:.2f})")
    Path(args.out).write_text(json.dumps({"load": load, "results": results}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

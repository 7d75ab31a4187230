"""Is a dynamic archive as fast in tract as the static one at the same size? (issue 28, goal
≤ 1.1×). Each model is exported once with its natural axes dynamic and once static per size;
both archives are loaded in this process (load + optimize time reported) and timed
interleaved, single-threaded, with the load average printed beside the ratios.

    python -m bench.dynamic_speed [--only NAME ...] [--rounds 12] [--burst 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

for _k, _v in (("RAYON_NUM_THREADS", "1"), ("TRACT_FLASH_SDPA_ST", "1"), ("OMP_NUM_THREADS", "1")):
    os.environ.setdefault(_k, _v)

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from bench.ab import interleaved, load_tract  # noqa: E402
from bench.dynamic_sweep import CATALOGUE  # noqa: E402

# model → the sizes to time at (input shapes); the dynamic export uses the catalogue's axes
CASES: dict[str, list[tuple[int, ...]]] = {
    "vision/yolov8n": [(1, 3, 320, 320), (1, 3, 480, 640)],
    "vision/smp_unet_resnet18": [(1, 3, 256, 256), (1, 3, 384, 512)],
    "speech/wav2vec2": [(1, 16000), (1, 64000)],
}


def load_at(path: Path, symbols: dict[str, int]) -> tuple[Any, float]:
    """The dynamic archive with its symbols set (tract's ``SetSymbols``) before optimizing: what
    a caller that knows its size does once per size."""
    import tract

    nnef = tract.nnef().with_tract_extra().with_tract_transformers()
    t0 = time.perf_counter()
    model = nnef.load(str(path))
    model.transform(tract.SetSymbols(symbols))
    return model.into_runnable(), time.perf_counter() - t0


def symbols_at(axes: dict, shape: tuple[int, ...]) -> dict[str, int]:
    """``{"h": 10}`` for an axis declared ``32*h`` of size 320 (``{"T": 16000}`` for ``T``)."""
    out = {}
    for axis, spec in axes["x"].items():
        k, _, symbol = spec.rpartition("*")
        out[symbol] = shape[axis] // int(k or 1)
    return out


def export(model: Any, example: torch.Tensor, path: Path, axes: dict | None) -> float:
    import torchlower

    t0 = time.perf_counter()
    torchlower.export(model, example, path, input_names=["x"], dynamic_axes=axes)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--burst", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from tests import torchvision_shim

    torchvision_shim.install()
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        for name, sizes in CASES.items():
            if args.only and not any(o in name for o in args.only):
                continue
            model, example, axes = CATALOGUE[name]()
            dyn_path = Path(tmp) / f"{name.replace('/', '_')}.dyn.nnef.tgz"
            try:
                export(model, example, dyn_path, axes)
            except Exception as exc:  # the dynamic export itself fails: say so and go on
                print(f"{name}: dynamic export failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
                continue
            dynamic, dyn_load = load_tract(dyn_path)
            for shape in sizes:
                x = torch.randn(*shape)
                static_path = Path(tmp) / f"{name.replace('/', '_')}.{'x'.join(map(str, shape))}.nnef.tgz"
                export(model, x, static_path, None)
                static, static_load = load_tract(static_path)
                inputs = [x.numpy()]
                t0 = time.perf_counter()
                dynamic.run(inputs)  # a dynamic model's first run at a size
                first = time.perf_counter() - t0
                bound, bound_load = load_at(dyn_path, symbols_at(axes, shape))
                runners = {"static": static, "dynamic": dynamic, "set": bound}
                times = interleaved(runners, inputs, args.rounds, args.burst)
                load = os.getloadavg()[0]
                print(
                    f"{name:26s} {'x'.join(map(str, shape)):14s} static {times['static'] * 1e3:8.2f} ms"
                    f"  dynamic {times['dynamic'] * 1e3:8.2f} ms ({times['dynamic'] / times['static']:.3f})"
                    f"  symbols set {times['set'] * 1e3:8.2f} ms ({times['set'] / times['static']:.3f})"
                    f"  load+optimize static {static_load:.2f} s dynamic {dyn_load:.2f} s set {bound_load:.2f} s"
                    f" (first run {first * 1e3:.0f} ms)  load avg {load:.2f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Is a dynamic archive as fast in tract as the static one at the same size? (issue 28, goal
≤ 1.1×). Each model is exported once with its natural axes dynamic and once static per size,
then run through the public API only, single-threaded (``threads=1``), interleaved round after
round so a loaded machine slows all alike:

- static: ``torchlower.load(static).run(x)``;
- dynamic: ``torchlower.load(dynamic).run(x)`` (the generic plan, every size);
- specialized: the same artifact, ``run(x, specialize=True)`` (a plan optimized at x's sizes).

Load + optimize is the first call less a median run: for static, ``torchlower.load`` + the tract
child's start + tract load + optimize; for dynamic the same at the first size (the generic plan
is reused at the next); for ``specialize`` the cost of a new size in the running child. A repeat
of the specialized call (its plan kept) is reported, with the largest output difference to the
static and the generic run, and the load average.
``--profile`` adds tract's per-op profile of the static and specialized plans (in this process).

    python -m bench.dynamic_speed [--only NAME ...] [--rounds 12] [--burst 3] [--keep DIR] [--profile]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

for _k, _v in (("RAYON_NUM_THREADS", "1"), ("TRACT_FLASH_SDPA_ST", "1"), ("OMP_NUM_THREADS", "1")):
    os.environ.setdefault(_k, _v)

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.ab import by_op, interleaved  # noqa: E402
from bench.dynamic_sweep import CATALOGUE  # noqa: E402

# model → the sizes to time at (input shapes); the dynamic export uses the catalogue's axes
CASES: dict[str, list[tuple[int, ...]]] = {
    "vision/yolov8n": [(1, 3, 320, 320), (1, 3, 480, 640)],
    "vision/smp_unet_resnet18": [(1, 3, 256, 256), (1, 3, 384, 512)],
    "speech/wav2vec2": [(1, 16000), (1, 64000)],
}


def export(model: Any, example: torch.Tensor, path: Path, axes: dict | None) -> None:
    """Export unless ``path`` exists already (``--keep`` reuses a folder's archives)."""
    import torchlower

    if not path.exists():
        torchlower.export(model, example, path, input_names=["x"], dynamic_axes=axes)


def timed_first(art: Any, x: np.ndarray, specialize: bool) -> tuple[float, np.ndarray]:
    """Seconds of a call that loads and optimizes a plan, and its output."""
    t0 = time.perf_counter()
    out = art.run([x], threads=1, specialize=specialize)
    return time.perf_counter() - t0, next(iter(out.values()))


def caller(art: Any, specialize: bool) -> Any:
    """What ``bench.ab.interleaved`` times: ``.run(inputs)`` through the public API."""
    return SimpleNamespace(run=lambda inputs: art.run(inputs, threads=1, specialize=specialize))


def profile(static: Path, dynamic: Path, sizes: dict[str, int], x: np.ndarray) -> None:
    """tract's per-op time of the static plan and of the dynamic archive's plan at ``sizes``."""
    from torchlower.nnef.session import tract_model

    plans = {"static": tract_model(str(static)), "specialized": tract_model(str(dynamic), sizes)}
    ops = {k: by_op(m.into_runnable(), [x]) for k, m in plans.items()}
    keys = sorted(set().union(*ops.values()), key=lambda k: -max(o.get(k, 0.0) for o in ops.values()))
    print(f"    {'op':40s} {'static':>10s} {'specialized':>12s}  (ms per run)")
    for k in [*keys[:12], "total"]:
        st, sp = ((sum(o.values()) if k == "total" else o.get(k, 0.0)) for o in ops.values())
        print(f"    {k[:40]:40s} {st * 1e3:10.2f} {sp * 1e3:12.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--burst", type=int, default=3)
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep (and reuse) the archives in this folder"
    )
    parser.add_argument(
        "--profile", action="store_true", help="tract's per-op profile, static vs specialized"
    )
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torchlower
    from tests import torchvision_shim
    from torchlower.artifact import runner

    torchvision_shim.install()
    torch.set_num_threads(1)
    root = Path(args.keep or tempfile.mkdtemp(prefix="torchlower-dynspeed-"))
    root.mkdir(parents=True, exist_ok=True)
    print("load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()), flush=True)
    for name, shapes in CASES.items():
        if args.only and not any(o in name for o in args.only):
            continue
        torch.manual_seed(0)
        model, example, axes = CATALOGUE[name]()
        stem = name.split("/")[1]
        dyn_path = root / f"{stem}.dyn.nnef.tgz"
        try:
            export(model, example, dyn_path, axes)
        except Exception as exc:  # the dynamic export itself fails: say so and go on
            print(f"{name}: dynamic export failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
            continue
        t0 = time.perf_counter()
        dynamic = torchlower.load(dyn_path)
        dyn_opened = time.perf_counter() - t0
        for i, shape in enumerate(shapes):
            x = torch.randn(*shape).numpy()
            static_path = root / f"{stem}.{'x'.join(map(str, shape))}.nnef.tgz"
            export(model, torch.from_numpy(x), static_path, None)
            t0 = time.perf_counter()
            static = torchlower.load(static_path)
            opened = time.perf_counter() - t0
            first = {"static": timed_first(static, x, False)}
            first["static"] = (first["static"][0] + opened, first["static"][1])
            first["dynamic"] = timed_first(dynamic, x, False)  # the generic plan loads at the first size only
            if i == 0:
                first["dynamic"] = (first["dynamic"][0] + dyn_opened, first["dynamic"][1])
            first["specialized"] = timed_first(dynamic, x, True)  # a new size: load + optimize at it
            again, _ = timed_first(dynamic, x, True)  # the same size: its plan is kept
            want = first["static"][1]
            diffs = {k: float(np.abs(v[1] - want).max()) for k, v in first.items()}
            same = float(np.abs(first["specialized"][1] - first["dynamic"][1]).max())
            runners = {k: caller(a, s) for k, a, s in (("static", static, False), ("dynamic", dynamic, False),
                                                       ("specialized", dynamic, True))}  # fmt: skip
            times = interleaved(runners, [x], args.rounds, args.burst)
            load = os.getloadavg()[0]
            st = times["static"]
            print(
                f"{name:26s} {'x'.join(map(str, shape)):12s} static {st * 1e3:8.2f} ms"
                f"  dynamic {times['dynamic'] * 1e3:8.2f} ms ({times['dynamic'] / st:.2f})"
                f"  specialized {times['specialized'] * 1e3:8.2f} ms ({times['specialized'] / st:.2f})"
                f"  load+optimize (first call - median run) static {first['static'][0] - st:.2f} s"
                f" dynamic {first['dynamic'][0] - times['dynamic']:.2f} s"
                f" specialized {first['specialized'][0] - times['specialized']:.2f} s"
                f" (kept plan: {again * 1e3:.1f} ms)"
                f"  max |Δ| vs static: dynamic {diffs['dynamic']:.1e} specialized {diffs['specialized']:.1e}"
                f" (vs dynamic {same:.1e})  load avg {load:.2f}",
                flush=True,
            )
            if args.profile:
                arrays = runner.as_list([x], dynamic.graph.inputs)
                sizes = runner.bind(
                    dynamic.graph.inputs, arrays, dynamic.graph.symbols, dynamic.graph.extensions
                )
                profile(static_path, dyn_path, sizes, x)
            static.close()
        dynamic.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

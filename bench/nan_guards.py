"""Cost of the NaN / special-value lowerings (issue 32) on ordinary float models, in tract.

    RAYON_NUM_THREADS=1 python -m bench.nan_guards [--base /work/main] [--rounds 15]

Each torchvision model (``weights=None``, eval) is exported twice, with the code at ``--base``
(before) and with this checkout (after), both archives are loaded in this one process and timed
interleaved (``bench.ab.interleaved``); prints medians, the ratio and ``uptime``'s load.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

for _k, _v in (("RAYON_NUM_THREADS", "1"), ("TRACT_FLASH_SDPA_ST", "1"), ("OMP_NUM_THREADS", "1")):
    os.environ.setdefault(_k, _v)

import numpy as np  # noqa: E402

from bench.ab import interleaved, load_tract  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
_EXPORT = """
import sys, torch, torchlower
sys.path.insert(0, {root!r})
from tests import torchvision_shim
torchvision_shim.install()
import torchvision
torch.manual_seed(0)
model = getattr(torchvision.models, {name!r})(weights=None).eval()
torchlower.export(model, torch.randn(1, 3, 224, 224), {path!r}, frontend="jit", check=False)
"""


def export(code: Path, name: str, path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(code))
    script = _EXPORT.format(root=str(ROOT), name=name, path=str(path))
    subprocess.run([sys.executable, "-c", script], check=True, env=env, cwd=code)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("models", nargs="*", default=["resnet18", "mobilenet_v2"])
    parser.add_argument("--base", default="/work/main")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--burst", type=int, default=3)
    opts = parser.parse_args(argv)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    for name in opts.models:
        with tempfile.TemporaryDirectory() as tmp:
            paths = {"before": Path(tmp) / "before.nnef.tgz", "after": Path(tmp) / "after.nnef.tgz"}
            export(Path(opts.base), name, paths["before"])
            export(ROOT, name, paths["after"])
            runners = {k: load_tract(p)[0] for k, p in paths.items()}
            outs = {k: r.run([x])[0].to_numpy() for k, r in runners.items()}
            t = interleaved(runners, [x], opts.rounds, opts.burst)
        err = float(np.abs(outs["before"] - outs["after"]).max())
        load = os.getloadavg()[0]
        print(
            f"{name}: before {t['before'] * 1e3:.1f} ms, after {t['after'] * 1e3:.1f} ms,"
            f" ratio {t['after'] / t['before']:.3f} (outputs differ by {err:.2g}; load {load:.1f})",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])

"""Where torchlower's export time goes: cProfile over warm exports of a few zoo models.

``python -m bench.profile_export FRONTEND REPEATS WORKDIR MODEL...`` prints one JSON line per
model: total time, the share of named phases (trace, reference forward, lowering, text, archive)
and the top functions by own time.
"""

from __future__ import annotations

import copy
import cProfile
import json
import os
import pstats
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from bench.zoo import ZOO

# (label, file suffix, function name) of the phases of torchlower.export
PHASES = (
    ("torch.jit.trace", "torchlower/frontends/jit.py", "_trace"),
    ("torch.export", "torch/export/__init__.py", "export"),
    ("lowering incl. lazy trace (front end + rules)", "torchlower/frontends/", "lower_"),
    ("rule calls", "torchlower/frontends/session.py", "apply"),
    ("graph text", "torchlower/nnef/builder.py", "graph_text"),
    ("live weights", "torchlower/nnef/builder.py", "live_weights"),
    ("archive write", "torchlower/nnef/archive.py", "write"),
    ("deepcopy (training-mode copy)", "copy.py", "deepcopy"),
)


def profile(name: str, frontend: str, repeats: int, workdir: Path) -> dict[str, Any]:
    import torchlower

    model, args = ZOO[name].build()
    folder = Path(tempfile.mkdtemp(dir=workdir))
    torchlower.export(copy.deepcopy(model), args, folder / "warm.nnef.tar", frontend=frontend, check=False)
    prof = cProfile.Profile()
    for i in range(repeats):  # a new file each time, as in the benchmark
        fresh = copy.deepcopy(model)
        prof.enable()
        torchlower.export(fresh, args, folder / f"{i}.nnef.tar", frontend=frontend, check=False)
        prof.disable()
    stats = pstats.Stats(prof)
    raw: dict[tuple[str, int, str], tuple[Any, ...]] = stats.stats  # type: ignore[attr-defined]
    total = max(ct for (_cc, _nc, _tt, ct, _callers) in raw.values()) / repeats
    phases = {}
    for label, suffix, fn in PHASES:
        cum = sum(
            v[3]
            for (file, _line, func), v in raw.items()
            if (func == fn and file.endswith(suffix))
            or (fn.endswith("_") and func.startswith(fn) and suffix in file)
        )
        if cum:
            phases[label] = cum / repeats
    top = sorted(raw.items(), key=lambda kv: kv[1][2], reverse=True)[:12]
    own = [
        {"function": f"{_short(file)}:{line}({func})", "calls": v[1] // repeats, "own_s": v[2] / repeats,
         "cum_s": v[3] / repeats}
        for (file, line, func), v in top
    ]  # fmt: skip
    return {"model": name, "frontend": frontend, "total_s": total, "phases": phases, "top_own": own}


def _short(file: str) -> str:
    for marker in ("site-packages/", "torchlower/", "lib/python3"):
        if marker in file:
            return (
                file.split(marker, 1)[1]
                if marker != "torchlower/"
                else "torchlower/" + file.split(marker, 1)[1]
            )
    return file


def main() -> None:
    frontend, repeats, workdir, models = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    torch.set_num_threads(1)
    for name in models:
        try:
            out.write(json.dumps(profile(name, frontend, repeats, workdir)) + "\n")
        except Exception as exc:
            out.write(
                json.dumps(
                    {"model": name, "frontend": frontend, "error": f"{type(exc).__name__}: {exc}"[:300]}
                )
                + "\n"
            )


if __name__ == "__main__":
    main()

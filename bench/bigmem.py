"""Peak RSS of exporting a wide MLP with ~1 GB of f32 weights, in a fresh process.

``python -m bench.bigmem EXPORTER WEIGHT_BYTES WIDTH WORKDIR`` prints one JSON line: weight bytes,
RSS baseline after building the model (and running it once), peak above that baseline during
the export, export time, artifact size. The target: peak ≤ 1.25 × weight bytes.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

from bench import memory
from bench.exporters import exporter
from bench.worker import weight_bytes
from bench.zoo import wide_mlp


def main() -> None:
    name, budget, width, workdir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    torch.set_num_threads(1)
    ex = exporter(name)
    model, args = wide_mlp(budget, width)
    with torch.no_grad():
        model(*args)
    folder = Path(tempfile.mkdtemp(prefix=f"bigmem-{name}-", dir=workdir))
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    res = {"exporter": name, "weight_bytes": weight_bytes(model), "largest_tensor_bytes": largest}
    try:
        base = memory.reset_peak()
        t0 = time.perf_counter()
        files = ex.export(model, args, folder)
        res["export_s"] = time.perf_counter() - t0
        res["baseline_rss"], res["peak_above_baseline"] = base, memory.peak() - base
        res["artifact_bytes"] = sum(f.stat().st_size for f in files)
        res["ok"] = True
    except Exception as exc:
        res.update(
            ok=False,
            error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}",
        )
    finally:
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()
    out.write(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()

"""A long-lived measuring process for one exporter family (``python -m bench.worker``).

Reads one JSON request per line on stdin, answers JSON lines on the original stdout (exporters'
own prints are redirected to stderr, i.e. the worker log). Each request measures one model with
one exporter: export time (a cold call, then warm repeats on fresh copies of the model), peak RSS
above the baseline, artifact size, load time, single-threaded inference time and max error vs
PyTorch. Before touching the runtime it sends a ``partial`` line, so a runtime abort (tract can
SIGABRT) still leaves the export numbers with the orchestrator.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bench import memory
from bench.exporters import exporter, load
from bench.zoo import ZOO

clock = time.perf_counter


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of distinct floating-point parameters and buffers (what an archive must store)."""
    seen: dict[int, int] = {}
    for t in [*model.parameters(), *model.buffers()]:
        if t.is_floating_point():
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(seen.values())


def tensor_payload(archive: Path) -> int:
    """Bytes of tensor data in an NNEF tar (``.dat`` members minus their 128-byte headers)."""
    with tarfile.open(archive) as tar:
        return sum(m.size - 128 for m in tar.getmembers() if m.name.endswith(".dat"))


def _flat(out: Any) -> list[np.ndarray]:
    leaves, _ = torch.utils._pytree.tree_flatten(out)
    return [t.detach().numpy() for t in leaves if isinstance(t, torch.Tensor)]


def max_error(want: list[np.ndarray], got: list[np.ndarray]) -> float:
    if len(want) != len(got):
        raise RuntimeError(f"{len(got)} outputs, PyTorch has {len(want)}")
    worst = 0.0
    for w, g in zip(want, got, strict=True):
        if w.shape != g.shape:
            raise RuntimeError(f"output shape {g.shape} != PyTorch {w.shape}")
        d = np.abs(w.astype(np.float64) - g.astype(np.float64))
        worst = max(worst, float(np.nan_to_num(d, nan=np.inf).max()) if d.size else 0.0)
    return worst


def _fresh_dir(folder: Path, i: int) -> Path:
    """A new, empty directory per export: writing over an existing file costs a flush on ext4
    (replace-via-rename / truncate heuristics), which would penalise atomic writers unevenly."""
    if i > 1:
        shutil.rmtree(folder / f"r{i - 2}", ignore_errors=True)
    path = folder / f"r{i}"
    path.mkdir()
    return path


def _timed_runs(fn: Any, seconds: float, min_runs: int, max_runs: int) -> list[float]:
    fn()
    fn()  # warm-up (allocations, caches)
    times: list[float] = []
    start = clock()
    while len(times) < max_runs and (len(times) < min_runs or clock() - start < seconds):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return times


def measure(req: dict[str, Any], res: dict[str, Any], send: Any) -> None:
    """Fill ``res`` step by step (so a failure keeps what was measured); ``res["stage"]`` says where."""
    case, ex = ZOO[req["model"]], exporter(req["exporter"])
    res["stage"] = "build"
    model, args = case.build()
    with torch.no_grad():
        want = _flat(model(*args))
    res["weight_bytes"] = weight_bytes(model)
    if req.get("torch_infer"):
        with torch.no_grad():
            runs = _timed_runs(lambda: model(*args), req["infer_seconds"], 5, req["max_runs"])
        res["torch_infer_s"] = statistics.median(runs)
    if ex.floor is not None:
        res["stage"] = "floor"
        res["floor_s"] = []
        for _ in range(max(1, req["repeats"] - 2)):
            fresh = copy.deepcopy(model)
            t0 = clock()
            ex.floor(fresh, args)
            res["floor_s"].append(clock() - t0)
    res["stage"] = "export"
    folder = Path(tempfile.mkdtemp(prefix=f"{ex.name}-{case.name}-", dir=req["workdir"]))
    fresh = copy.deepcopy(model)  # cold: includes lazy imports when it is the first model
    t0 = clock()
    files = ex.export(fresh, args, _fresh_dir(folder, 0))
    res["export_cold_s"] = clock() - t0
    times, peaks = [], []
    # slow exporters get fewer repeats (their relative noise is smaller), to keep the run short
    repeats = req["repeats"] if res["export_cold_s"] < 1.0 else max(2, req["repeats"] - 2)
    for _ in range(repeats):
        fresh = copy.deepcopy(model)
        base = memory.reset_peak()
        t0 = clock()
        files = ex.export(fresh, args, _fresh_dir(folder, len(times) + 1))
        times.append(clock() - t0)
        peaks.append(memory.peak() - base)
    res["export_s"] = times
    res["export_rss_delta"] = max(peaks)
    res["process_peak_rss"] = memory.peak()
    res["artifact_bytes"] = sum(f.stat().st_size for f in files)
    if files[0].name.endswith(".nnef.tar"):
        res["tensor_payload_bytes"] = tensor_payload(files[0])
    res["stage"] = "runtime"
    send({"partial": True, **res})  # tract may abort the process from here on

    inputs = [a.numpy() for a in args]
    res["load_s"] = []
    for _ in range(req["load_repeats"]):
        loaded = load(ex.runtime, files[0], clock)
        res["load_s"].append(sum(loaded.steps.values()))
        res["load_steps"] = loaded.steps
    res["max_abs_error"] = max_error(want, loaded.run(inputs))
    runs = _timed_runs(lambda: loaded.run(inputs), req["infer_seconds"], 5, req["max_runs"])
    res["infer_s"], res["infer_runs"] = statistics.median(runs), len(runs)


def _reason(exc: BaseException) -> str:
    lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
    head = lines[0] if lines else ""
    detail = "; ".join(ln.strip() for ln in lines[1:6])
    return f"{type(exc).__name__}: {head}" + (f" [{detail}]" if detail else "")


def main() -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # exporters print progress; keep it out of the protocol
    sys.stdout = sys.stderr
    torch.set_num_threads(1)

    def send(obj: dict[str, Any]) -> None:
        out.write(json.dumps(obj) + "\n")

    send({"ready": True})
    for line in sys.stdin:
        req = json.loads(line)
        print(f"--- {req['exporter']} {req['model']}", file=sys.stderr, flush=True)
        res: dict[str, Any] = {"model": req["model"], "exporter": req["exporter"]}
        try:
            measure(req, res, send)
            send({**res, "final": True, "ok": True})
        except BaseException as exc:  # report any failure of this model, keep serving
            traceback.print_exc()
            send({**res, "final": True, "ok": False, "failed_in": res.get("stage"), "error": _reason(exc)})
            if isinstance(exc, KeyboardInterrupt):
                raise


if __name__ == "__main__":
    main()

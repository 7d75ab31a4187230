"""Run NNEF artifacts in tract inside a child process (tract may abort instead of raising).

Two modes, both importing only numpy and tract (never torch), so the child starts fast:
``python -m torchlower.nnef.tract_runner ARTIFACT IN.npz OUT.npz`` runs once;
``python -m torchlower.nnef.tract_runner --serve`` answers one JSON request per line, so a
process checking many artifacts pays the interpreter start-up once.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np


def run(artifact: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    return run_points(artifact, [inputs])[0]


def run_points(artifact: str, points: list[list[np.ndarray]]) -> list[list[np.ndarray]]:
    """Load and optimize ``artifact`` once, run it on every input set (the costly part is the load)."""
    import tract

    nnef = tract.nnef().with_tract_extra().with_tract_transformers().with_onnx()
    runnable = nnef.load(artifact).into_runnable()
    results = []
    for k, inputs in enumerate(points):
        try:
            results.append([t.to_numpy() for t in runnable.run(inputs)])
        except Exception as exc:
            raise RuntimeError(f"input set {k}: {exc}") from exc
    return results


def run_files(artifact: str, inputs_path: str, outputs_path: str) -> str | None:
    """Run ``artifact`` on the arrays of ``inputs_path``; ``None`` on success, else the error.

    Arrays are named ``arr_{i}`` (one input set) or ``p{k}_{i}`` (input set ``k``); the
    outputs come back under the same scheme.
    """
    with np.load(inputs_path) as data:
        names = list(data.files)
        if names and names[0].startswith("p"):
            count = 1 + max(int(n[1:].split("_")[0]) for n in names)
            sizes = [sum(n.startswith(f"p{k}_") for n in names) for k in range(count)]
            points = [[data[f"p{k}_{i}"] for i in range(sizes[k])] for k in range(count)]
        else:
            points = [[data[f"arr_{i}"] for i in range(len(names))]]
    try:
        outputs = run_points(artifact, points)
    except Exception as exc:  # tract raises TractError; report it as text to the parent
        return f"{type(exc).__name__}: {str(exc).split('Stack backtrace')[0].strip()}"
    if len(points) == 1 and not (names and names[0].startswith("p")):
        np.savez(outputs_path, *outputs[0])
    else:
        np.savez(
            outputs_path, **{f"p{k}_{i}": o for k, outs in enumerate(outputs) for i, o in enumerate(outs)}
        )
    return None


def serve() -> int:
    """Answer requests on stdin; replies go to the original stdout, everything else to stderr."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # a stray print in a library must not corrupt the protocol
    for line in sys.stdin:
        request = json.loads(line)
        error = run_files(request["artifact"], request["inputs"], request["outputs"])
        replies.write(json.dumps({"error": error}) + "\n")
        replies.flush()
    return 0


def main(argv: list[str]) -> int:
    if argv == ["--serve"]:
        return serve()
    error = run_files(*argv)
    if error is not None:
        sys.stderr.write(error + "\n")
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

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
    import tract

    nnef = tract.nnef().with_tract_extra().with_tract_transformers()
    runnable = nnef.load(artifact).into_runnable()
    return [t.to_numpy() for t in runnable.run(inputs)]


def run_files(artifact: str, inputs_path: str, outputs_path: str) -> str | None:
    """Run ``artifact`` on the arrays of ``inputs_path``; ``None`` on success, else the error."""
    with np.load(inputs_path) as data:
        inputs = [data[f"arr_{i}"] for i in range(len(data.files))]
    try:
        outputs = run(artifact, inputs)
    except Exception as exc:  # tract raises TractError; report it as text to the parent
        return f"{type(exc).__name__}: {str(exc).split('Stack backtrace')[0].strip()}"
    np.savez(outputs_path, *outputs)
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

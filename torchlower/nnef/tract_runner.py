"""Run an NNEF artifact in tract, in a child process (tract may abort instead of raising).

Invoked as ``python -m torchlower.nnef.tract_runner ARTIFACT INPUTS.npz OUTPUTS.npz``; it
imports only numpy and tract so the child starts fast and never needs torch.
"""

from __future__ import annotations

import sys

import numpy as np


def run(artifact: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    import tract

    nnef = tract.nnef().with_tract_extra().with_tract_transformers()
    runnable = nnef.load(artifact).into_runnable()
    return [t.to_numpy() for t in runnable.run(inputs)]


def main(argv: list[str]) -> int:
    artifact, inputs_path, outputs_path = argv
    with np.load(inputs_path) as data:
        inputs = [data[f"arr_{i}"] for i in range(len(data.files))]
    try:
        outputs = run(artifact, inputs)
    except Exception as exc:  # tract raises TractError; report it as text to the parent
        sys.stderr.write(f"{type(exc).__name__}: {str(exc).split('Stack backtrace')[0].strip()}\n")
        return 3
    np.savez(outputs_path, *outputs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

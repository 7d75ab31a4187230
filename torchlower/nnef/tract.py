"""Checking an artifact: run it in tract (child process) and compare with PyTorch."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import numpy as np

from torchlower.errors import CheckError

RUN_TIMEOUT_S = 600


class _Worker:
    """One long-lived tract child per process; restarted after it dies (an abort)."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self.stderr: IO[bytes] | None = None
        self.lock = threading.Lock()

    def _start(self) -> subprocess.Popen[str]:
        if self.proc is None or self.proc.poll() is not None:
            self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the child)
            env = dict(os.environ, RAYON_NUM_THREADS=os.environ.get("RAYON_NUM_THREADS", "1"))
            env.update(RUST_BACKTRACE="0", RUST_LIB_BACKTRACE="0")
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "torchlower.nnef.tract_runner", "--serve"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.stderr,
                text=True,
                env=env,
                cwd=Path(__file__).resolve().parents[2],
            )
        return self.proc

    def request(self, artifact: Path, ins: Path, outs: Path) -> None:
        with self.lock:
            proc = self._start()
            assert proc.stdin is not None and proc.stdout is not None
            try:
                message = {"artifact": str(artifact), "inputs": str(ins), "outputs": str(outs)}
                proc.stdin.write(json.dumps(message) + "\n")
                proc.stdin.flush()
                ready, _, _ = select.select([proc.stdout], [], [], RUN_TIMEOUT_S)
                line = proc.stdout.readline() if ready else ""
            except BrokenPipeError:
                ready, line = [proc.stdout], ""
            if not line:
                raise CheckError(_named(artifact, self._death(timed_out=not ready)))
            error = json.loads(line)["error"]
            if error is not None:
                raise CheckError(_named(artifact, error[-4000:]))

    def _death(self, timed_out: bool) -> str:
        """Why the child stopped answering; it is killed so the next request starts afresh."""
        assert self.proc is not None and self.stderr is not None
        if timed_out:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            return f"tract did not answer within {RUN_TIMEOUT_S} s"
        self.proc.wait()
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace")
        panic = text.find("panicked at")
        tail = (text[panic:] if panic >= 0 else text).strip()
        tail = tail.split("\nnote: run with")[0].split("stack backtrace:")[0].strip()[:2000]
        code = self.proc.returncode
        self.proc = None
        what = f"tract aborted the process (signal {-code})" if code < 0 else f"exit status {code}"
        return f"{what}. {tail}"


_WORKER = _Worker()


def run_in_tract(artifact: str | os.PathLike[str], inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Outputs of the artifact on ``inputs``; a tract failure or abort becomes ``CheckError``."""
    return run_points_in_tract(artifact, [inputs])[0]


def run_points_in_tract(
    artifact: str | os.PathLike[str], points: Sequence[Sequence[np.ndarray]]
) -> list[list[np.ndarray]]:
    """Outputs of the artifact on each input set, loaded once; failures become ``CheckError``."""
    with tempfile.TemporaryDirectory(prefix="torchlower-check-") as tmp:
        ins, outs = Path(tmp, "in.npz"), Path(tmp, "out.npz")
        np.savez(ins, **{f"p{k}_{i}": a for k, arrays in enumerate(points) for i, a in enumerate(arrays)})
        _WORKER.request(Path(artifact).resolve(), ins, outs)
        with np.load(outs) as data:
            found = list(data.files)
            return [
                [data[f"p{k}_{i}"] for i in range(sum(n.startswith(f"p{k}_") for n in found))]
                for k in range(len(points))
            ]


def _named(artifact: Path, why: str) -> str:
    """ "tract could not run …" naming the user's path, not the staged name it was checked at."""
    from torchlower.core.staging import target_of

    target = target_of(Path(artifact))
    if target == Path(artifact):
        return f"tract could not run {artifact}: {why}"
    return f"tract could not run {target} (nothing written): {why.replace(str(artifact), str(target))}"

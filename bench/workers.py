"""Driving ``bench.worker`` processes from the orchestrator: start, ask, time out, restart.

One worker per exporter family (torchlower front ends share one), so each family pays its
imports once. A worker that dies (tract may abort the process) or hangs is replaced, and the
model it was measuring is recorded as failed with the reason.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from bench.exporters import single_threaded_env

ROOT = Path(__file__).resolve().parents[1]


def family_of(exporter: str) -> str:
    return "torchlower" if exporter.startswith("tl-") else exporter


class Worker:
    def __init__(self, family: str, logdir: Path, python: str = sys.executable) -> None:
        self.family, self.logdir, self.python = family, logdir, python
        self.proc: subprocess.Popen[str] | None = None
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.starts = 0

    @property
    def log(self) -> Path:
        return self.logdir / f"worker-{self.family}.log"

    def _start(self, timeout: float) -> None:
        self.starts += 1
        log = self.log.open("a")
        self.proc = subprocess.Popen(
            [self.python, "-m", "bench.worker"], cwd=ROOT, env=single_threaded_env(), text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, bufsize=1,
        )  # fmt: skip
        self.lines = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc, self.lines), daemon=True).start()
        ready = self.lines.get(timeout=timeout)
        if ready is None:
            raise RuntimeError(f"{self.family} worker did not start: {self._tail()}")

    @staticmethod
    def _pump(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def ask(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request; returns the final answer, or a failure record keeping partial data."""
        if self.proc is None or self.proc.poll() is not None:
            self._start(timeout=120)
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        partial: dict[str, Any] = {}
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                self.stop()
                return self._failed(partial, f"timeout after {timeout:.0f} s")
            if line is None:
                code = self.proc.wait()
                self.proc = None
                why = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
                return self._failed(partial, f"worker died ({why}): {self._tail()}")
            msg = json.loads(line)
            if msg.get("final"):
                msg.pop("final")
                return msg
            partial = msg

    def _failed(self, partial: dict[str, Any], reason: str) -> dict[str, Any]:
        partial.pop("partial", None)
        return {**partial, "ok": False, "failed_in": partial.get("stage", "export"), "error": reason}

    def _tail(self, lines: int = 3) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(ln.strip() for ln in text[-lines:])[-600:]

    def stop(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()  # only our own child, by its handle
            self.proc.wait()
            self.proc = None

"""A loaded, optimized tract model that runs many times: ``torchlower.load(path).run(...)``.

The model lives in a child process by default (``python -m torchlower.nnef.session --serve``),
for two reasons the tract Python package imposes:

- tract can abort the whole process on a Rust panic instead of raising; a user's process must
  survive that, so the abort becomes a ``CheckError`` and the next call starts a fresh child;
- tract has no thread setting in its Python API: its pool reads ``RAYON_NUM_THREADS`` once,
  when it starts. A child gets its own environment, so ``threads=`` works per artifact.

The child loads and optimizes (``into_runnable``) a plan once — the generic one, and one per
size assignment the caller asks to specialize for — then answers run requests on its
stdin/stdout. Arrays travel as raw bytes behind a one-line JSON header (dtype, shape), so a
call costs one copy each way and no pickling. ``isolated=False`` runs tract in this process
instead (lowest per-call cost, no abort protection, threads from the environment).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from torchlower.core.dtypes import CANONICAL
from torchlower.errors import CheckError, InvalidArgumentError

_WIRE_DTYPES = frozenset(CANONICAL) - {"bfloat16"}  # numpy has no bfloat16 to send


def tract_model(folder: str, sizes: Mapping[str, int] | None = None) -> Any:
    """Load ``folder`` with every registry torchlower may use (the model is not optimized yet).

    ``sizes`` fixes symbols before tract optimizes (its ``SetSymbols``): tract 0.23 lowers a
    convolution over symbolic spatial sizes to im2col + matmul, up to 3x slower than the direct
    kernels it picks once the sizes are known.
    """
    import tract

    model = tract.nnef().with_tract_extra().with_tract_transformers().with_onnx().load(folder)
    if sizes:
        model.transform(tract.SetSymbols(dict(sizes)))
    return model


def facts(model: Any) -> dict[str, list[str]]:
    """tract's view of the declared inputs and derived outputs: ``"B,3,f32"`` per tensor."""
    return {
        "inputs": [str(model.input_fact(i)) for i in range(model.input_count())],
        "outputs": [str(model.output_fact(i)) for i in range(model.output_count())],
    }


def parse_fact(text: str) -> tuple[list[int | str], str]:
    """``"B,10,f32"`` → ``(["B", 10], "float32")``; symbolic sizes stay text (``"S+1"``)."""
    from torchlower.core import dtypes

    *dims, datum = text.split(",")
    shape: list[int | str] = [int(d) if d.strip().isdigit() else d.strip() for d in dims]
    return shape, dtypes.name(datum.strip())


# ---- wire format -------------------------------------------------------------------------
def send(stream: IO[bytes], header: dict[str, Any], arrays: Sequence[np.ndarray]) -> None:
    """One message: a JSON line (with each array's dtype and shape), then the arrays' bytes."""
    arrays = [np.asarray(a, order="C") for a in arrays]  # (ascontiguousarray makes 0-d arrays 1-d)
    header = {**header, "arrays": [[a.dtype.name, list(a.shape)] for a in arrays]}
    stream.write(json.dumps(header).encode() + b"\n")
    for a in arrays:
        if a.size:  # an empty tensor has a header and no bytes
            stream.write(memoryview(a.reshape(-1).view(np.uint8)))
    stream.flush()


def receive(stream: IO[bytes]) -> tuple[dict[str, Any], list[np.ndarray]] | None:
    """The next message, or None at end of stream (the other side is gone)."""
    line = stream.readline()
    if not line:
        return None
    header = json.loads(line)
    arrays = []
    for dtype_name, shape in header.pop("arrays"):
        if dtype_name not in _WIRE_DTYPES:
            raise CheckError(f"tract returned a tensor of unsupported dtype {dtype_name!r}")
        dtype = np.dtype(dtype_name)
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        buffer = bytearray(size)
        view, got = memoryview(buffer), 0
        while got < size:
            n = stream.readinto(view[got:])  # type: ignore[attr-defined]
            if not n:
                return None
            got += n
        arrays.append(np.frombuffer(buffer, dtype=dtype).reshape(shape))
    return header, arrays


# ---- child side --------------------------------------------------------------------------
def serve() -> int:
    """Answer the parent's requests until stdin closes. ``{"load": folder, "plan": key, "sizes":
    {...}, "drop": [keys]}`` drops plans the parent evicted, then loads and optimizes ``folder``
    at ``sizes`` and replies its facts; ``{"plan": key}`` with arrays runs that plan."""
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # a stray print in a library must not corrupt the protocol
    requests = os.fdopen(0, "rb")
    plans: dict[str, Any] = {}  # plan key -> runnable (the parent decides which are kept)
    while (message := receive(requests)) is not None:
        header, inputs = message
        try:
            if "load" in header:
                for key in header.get("drop", []):
                    plans.pop(key, None)
                model = tract_model(header["load"], header["sizes"])
                known = facts(model)
                plans[header["plan"]] = model.into_runnable()
                send(replies, {"error": None, **known}, [])
                continue
            outputs = [t.to_numpy() for t in plans[header["plan"]].run(inputs)]
        except Exception as exc:  # tract raises TractError; reported as text to the parent
            send(replies, {"error": short(exc)}, [])
            continue
        send(replies, {"error": None}, outputs)
    return 0


def short(exc: BaseException) -> str:
    """A tract exception as one message, without the Rust backtrace."""
    return f"{type(exc).__name__}: {str(exc).split('Stack backtrace')[0].strip()}"[:4000]


# ---- the child process, for every tract session (this module's and nnef/pulse.py's) -----------
class Child:
    """``python -m module *args`` speaking the wire format on its pipes, its stderr kept in a file
    so a death can quote tract's panic. ``threads`` sets tract's pool (read once per process)."""

    def __init__(self, module: str, args: Sequence[str], threads: int | None) -> None:
        env = dict(os.environ, RUST_BACKTRACE="0", RUST_LIB_BACKTRACE="0")
        if threads is not None:
            env["RAYON_NUM_THREADS"] = str(threads)
            if threads == 1:
                env["TRACT_FLASH_SDPA_ST"] = "1"  # tract's flash attention has its own pool
        self.stderr: IO[bytes] | None = tempfile.TemporaryFile()  # noqa: SIM115 (lives with the child)
        self.proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            env=env,
            cwd=Path(__file__).resolve().parents[2],
        )

    def exchange(
        self, header: dict[str, Any], inputs: Sequence[np.ndarray] | None, gone: str
    ) -> tuple[dict[str, Any], list[Any]]:
        """Send ``inputs`` (None: only read the next reply) and return the reply; a child that
        stopped answering is a ``CheckError`` ``gone`` + why (the signal and tract's panic)."""
        if self.proc is None:
            raise CheckError(gone + ": the tract process stopped earlier")
        assert self.proc.stdin is not None and self.proc.stdout is not None
        reply = None
        try:
            if inputs is not None:
                send(self.proc.stdin, header, inputs)
            reply = receive(self.proc.stdout)
        except (BrokenPipeError, ConnectionResetError):
            reply = None
        if reply is None:
            raise CheckError(f"{gone}: {self._death()}")
        return reply

    def _death(self) -> str:
        assert self.proc is not None and self.stderr is not None
        proc, self.proc = self.proc, None
        code = proc.wait()
        self.stderr.seek(0)
        text = self.stderr.read().decode(errors="replace")
        panic = text.find("panicked at")
        tail = (text[panic:] if panic >= 0 else text).strip()
        tail = tail.split("\nnote: run with")[0].split("stack backtrace:")[0].strip()[:2000]
        what = f"tract aborted its process (signal {-code})" if code < 0 else f"exit status {code}"
        return f"{what}. {tail}".strip()

    def stop(self) -> None:
        """Close the pipes and wait for the child (killed after 5 s); idempotent."""
        proc, self.proc = self.proc, None
        stderr, self.stderr = self.stderr, None
        if proc is not None:
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if stderr is not None:
            stderr.close()


# ---- parent side -------------------------------------------------------------------------
KEPT = 4  # plans optimized for one size assignment kept per session, besides the generic one


def plan_key(sizes: Mapping[str, int] | None) -> str:
    """``"B=1,h=10"`` for a plan optimized at those sizes, ``""`` for the generic plan."""
    return ",".join(f"{k}={int(v)}" for k, v in sorted((sizes or {}).items()))


class Session:
    """The optimized tract plans of one archive; ``run`` is called many times.

    The generic plan serves every size the archive declares. ``run(inputs, sizes)`` uses a plan
    optimized at ``sizes`` instead: the graph text with the sizes written in (``concretize``),
    else tract's ``SetSymbols`` before it optimizes. tract 0.23 lowers a convolution over
    symbolic spatial sizes to im2col + matmul (up to 4x slower than the direct kernels it picks
    at known sizes) and loads symbolic size arithmetic slowly. The last ``kept`` sized plans stay
    loaded beside the generic one, in the one child. Plans load on first use from the checked
    bytes of ``path``: the generic one from a folder removed at once, sized ones from a folder
    kept until ``close`` (each new size loads again: tract's Python API cannot copy a model).
    """

    def __init__(
        self, path: Path, threads: int | None = None, isolated: bool = True, kept: int = KEPT
    ) -> None:
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise InvalidArgumentError(f"threads must be a positive integer, got {threads!r}")
        if threads is not None and not isolated:
            raise InvalidArgumentError(
                "threads= needs isolated=True: tract's thread pool reads RAYON_NUM_THREADS once per"
                " process; set that variable before the first run instead"
            )
        self.path, self.threads, self.isolated, self.kept = Path(path), threads, isolated, kept
        self.lock = threading.RLock()  # a plan is loaded, then run, without another call between
        self.plans: OrderedDict[str, dict[str, list[str]]] = OrderedDict()  # key -> facts, LRU last
        self.runnables: dict[str, Any] = {}  # in this process (isolated=False)
        self.folders = contextlib.ExitStack()  # the extracted archive sized plans load from
        self.folder: Path | None = None
        self.text = ""  # its graph.nnef as the archive holds it
        self.child = Child("torchlower.nnef.session", ["--serve"], threads) if isolated else None

    def loaded(self, sizes: Mapping[str, int] | None = None) -> bool:
        """Whether the plan at ``sizes`` (generic for None) is loaded already."""
        return plan_key(sizes) in self.plans

    def load(self, sizes: Mapping[str, int] | None = None) -> dict[str, list[str]]:
        """tract's facts of the plan at ``sizes`` (the generic one for None), loading and
        optimizing it on first use."""
        key = plan_key(sizes)
        with self.lock:
            if key in self.plans:
                self.plans.move_to_end(key)
                return self.plans[key]
            sized = [k for k in self.plans if k]
            drop = sized[: max(0, len(sized) - self.kept + 1)] if key else []
            for k in drop:
                del self.plans[k]
                self.runnables.pop(k, None)
            with self._folder(key, sizes or {}) as (folder, symbols):
                self.plans[key] = self._load(folder, key, symbols, drop)
            return self.plans[key]

    @contextlib.contextmanager
    def _folder(self, key: str, sizes: Mapping[str, int]) -> Iterator[tuple[Path, dict[str, int]]]:
        """The folder to load the plan at ``sizes`` from, and the sizes left for ``SetSymbols``:
        none when the sizes could be written into the graph text (``concretize``)."""
        from torchlower.nnef import reader
        from torchlower.nnef.concretize import concretize

        if self.folder is None and key:
            self.folder = self.folders.enter_context(reader.extracted(self.path))
            self.text = (self.folder / "graph.nnef").read_text(encoding="utf-8")
        if self.folder is None:
            with reader.extracted(self.path) as folder:  # tract reads exactly the bytes we validated
                yield folder, {}
            return
        text = concretize(self.text, sizes)
        (self.folder / "graph.nnef").write_text(text or self.text, encoding="utf-8")
        yield self.folder, ({} if text is not None else dict(sizes))

    def _load(self, folder: Path, key: str, sizes: dict[str, int], drop: list[str]) -> dict[str, list[str]]:
        if not self.isolated:
            try:
                model = tract_model(str(folder), sizes)
                known = facts(model)
                self.runnables[key] = model.into_runnable()
            except Exception as exc:
                raise CheckError(f"tract could not load {self.path}: {short(exc)}") from None
            return known
        header = {"load": str(folder), "plan": key, "sizes": sizes, "drop": drop}
        reply, _ = self._exchange(header, [], "load")
        return {"inputs": reply["inputs"], "outputs": reply["outputs"]}

    @property
    def facts(self) -> dict[str, list[str]]:
        """tract's facts of the generic plan (symbols kept), loading it if needed."""
        return self.load(None)

    def run(self, inputs: Sequence[np.ndarray], sizes: Mapping[str, int] | None = None) -> list[np.ndarray]:
        """tract's outputs on ``inputs`` (already checked against the declaration; ``sizes`` are
        the symbols they bind, for a plan optimized at them)."""
        key = plan_key(sizes)
        with self.lock:
            self.load(sizes)
            if not self.isolated:
                try:
                    return [t.to_numpy() for t in self.runnables[key].run(list(inputs))]
                except Exception as exc:
                    raise CheckError(f"tract could not run the model: {short(exc)}") from None
            return self._exchange({"plan": key}, inputs, "run")[1]

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.child.proc if self.child is not None else None

    def _exchange(
        self, header: dict[str, Any], inputs: Sequence[np.ndarray], what: str
    ) -> tuple[dict[str, Any], list[Any]]:
        assert self.child is not None
        if self.proc is None:
            raise CheckError("the tract process of this artifact stopped earlier; load the artifact again")
        reply = self.child.exchange(header, inputs, f"tract could not {what} {self.path}")
        if reply[0]["error"] is not None:
            raise CheckError(f"tract could not {what} the model: {reply[0]['error']}")
        return reply

    def close(self) -> None:
        """Stop the child (or drop the in-process plans) and remove the kept folder; idempotent."""
        self.runnables.clear()
        self.plans.clear()
        if self.child is not None:
            self.child.stop()
        self.folders.close()
        self.folder = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: nothing left to clean up with
            self.close()


def query_facts(folder: Path, timeout: float = 600) -> dict[str, list[str]]:
    """tract's facts of ``folder`` without optimizing or running it (a child process, as above)."""
    env = dict(os.environ, RUST_BACKTRACE="0", RUST_LIB_BACKTRACE="0")
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "torchlower.nnef.session", "--facts", str(folder)],
            capture_output=True,
            env=env,
            timeout=timeout,
            cwd=Path(__file__).resolve().parents[2],
        )
    except subprocess.TimeoutExpired:
        raise CheckError(f"tract did not load {folder} within {timeout:.0f} s") from None
    if proc.returncode != 0:
        text = proc.stderr.decode(errors="replace")
        panic = text.find("panicked at")
        tail = (text[panic:] if panic >= 0 else text).strip().split("stack backtrace:")[0][:2000]
        raise CheckError(f"tract could not load {folder}: {tail}")
    return json.loads(proc.stdout)


def _print_facts(folder: str) -> int:
    try:
        known = facts(tract_model(folder))
    except Exception as exc:
        sys.stderr.write(short(exc) + "\n")
        return 3
    sys.stdout.write(json.dumps(known))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--facts"]:
        sys.exit(_print_facts(sys.argv[2]))
    sys.exit(serve())

"""One ``State.run`` of a pulsed tract model through tract's C API directly (``push`` of
``nnef/pulse.py``, in this process and in the stream's child).

A pulsed model runs once per chunk, so the per-call cost is the floor of a stream's cost
(bench/stream_floor.py). tract's C call itself takes ~1.5 µs; the ``tract`` Python package's
``State.run`` + ``Tensor.to_numpy`` adds ~35–60 µs per call around it (two count queries, an
``IntEnum`` per tensor, ``numpy.ctypeslib.as_array`` building a ctypes array type per output).
``FastState.run`` makes the same C calls (``tract_tensor_from_bytes``, ``tract_state_run``,
``tract_tensor_as_bytes``, ``tract_tensor_destroy``: tract copies the input bytes and does not
own the input tensors) with the counts and dtype codes resolved once. A tract package without
those symbols, or a dtype outside the table, falls back to ``State.run``.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

# tract's DatumType codes (tract/tensor.py) for the numpy dtypes a stream carries
_CODES = {
    np.dtype(np.bool_): 0x01,
    np.dtype(np.uint8): 0x11,
    np.dtype(np.uint16): 0x12,
    np.dtype(np.uint32): 0x14,
    np.dtype(np.uint64): 0x18,
    np.dtype(np.int8): 0x21,
    np.dtype(np.int16): 0x22,
    np.dtype(np.int32): 0x24,
    np.dtype(np.int64): 0x28,
    np.dtype(np.float16): 0x32,
    np.dtype(np.float32): 0x34,
    np.dtype(np.float64): 0x38,
}
_DTYPES = {code: dtype for dtype, code in _CODES.items()}
_SYMBOLS = ("tract_tensor_from_bytes", "tract_state_run", "tract_tensor_as_bytes", "tract_tensor_destroy")


class FastState:
    """``state.run(arrays)`` → the outputs as numpy arrays (copies tract no longer owns). Calls
    are serialized by a lock: ctypes releases the GIL during tract's run, and the C argument
    buffers are reused (two threads pushing at once must not swap each other's outputs)."""

    def __init__(self, state: Any) -> None:
        from tract.bindings import lib

        self.state, self.lib, self.lock = state, lib, threading.Lock()
        self.direct = all(hasattr(lib, s) for s in _SYMBOLS) and hasattr(state, "ptr")
        if self.direct:
            self.ins = (ctypes.c_void_p * state.input_count())()
            self.outs = (ctypes.c_void_p * state.output_count())()
        self.shapes: dict[tuple[int, ...], Any] = {}  # a C array per input shape seen
        # tract_tensor_as_bytes' out-parameters, and references to them, made once
        self.code, self.rank = ctypes.c_uint32(), ctypes.c_size_t()
        self.dims, self.data = ctypes.POINTER(ctypes.c_size_t)(), ctypes.c_void_p()
        self.refs = tuple(map(ctypes.byref, (self.code, self.rank, self.dims, self.data)))

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        with self.lock:
            if not self.direct or any(a.dtype not in _CODES for a in arrays):
                return [t.to_numpy() for t in self.state.run(list(arrays))]
            return self._run(arrays)

    def _run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        lib, made, pending = self.lib, [], []
        try:
            for i, array in enumerate(arrays):
                a = np.ascontiguousarray(array)
                shape = self.shapes.get(a.shape)
                if shape is None:
                    shape = self.shapes[a.shape] = (ctypes.c_size_t * a.ndim)(*a.shape)
                ptr = ctypes.c_void_p()
                data = ctypes.c_void_p(a.ctypes.data)
                _check(
                    lib, lib.tract_tensor_from_bytes(_CODES[a.dtype], a.ndim, shape, data, ctypes.byref(ptr))
                )
                made.append(ptr)
                self.ins[i] = ptr
            _check(lib, lib.tract_state_run(self.state.ptr, self.ins, self.outs))
            pending = [ctypes.c_void_p(p) for p in self.outs]
            results = []
            while pending:
                ptr = pending.pop(0)
                array = self.copy(ptr)
                if array is None:  # a datum type numpy has no plain dtype for: the package's own
                    import tract

                    array = tract.Tensor(ptr).to_numpy()  # that Tensor destroys ptr
                else:
                    lib.tract_tensor_destroy(ctypes.byref(ptr))
                results.append(array)
            return results
        finally:
            for ptr in made + pending:
                lib.tract_tensor_destroy(ctypes.byref(ptr))

    def copy(self, ptr: ctypes.c_void_p) -> np.ndarray | None:
        """The tensor's data copied into a new array; None for a datum type outside the table."""
        _check(self.lib, self.lib.tract_tensor_as_bytes(ptr, *self.refs))
        dtype = _DTYPES.get(self.code.value)
        if dtype is None:
            return None
        out = np.empty(self.dims[: self.rank.value], dtype)
        if out.nbytes:
            ctypes.memmove(out.ctypes.data, self.data, out.nbytes)
        return out


def _check(lib: Any, code: int) -> None:
    if code != 0:
        import tract

        raise tract.TractError(str(lib.tract_get_last_error(), "utf-8"))

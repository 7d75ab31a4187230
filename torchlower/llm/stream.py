"""Weights larger than RAM: parameters memory-mapped from the safetensors files, released once written.

The model is built with its parameters on the ``meta`` device (no memory; buffers such as
rotary frequencies are computed for real), then each parameter becomes a tensor *viewing* the
checkpoint file through a private memory map — nothing is read until used. Tracing reads
shapes only; writing the archive reads each tensor once, and ``release`` then drops its pages
(``madvise(MADV_DONTNEED)``) so the resident set stays near one tensor instead of the model.
Only f32 tensors are mapped (the model runs in f32); a checkpoint in another dtype is loaded
the ordinary way by ``source.load_model``.
"""

from __future__ import annotations

import json
import mmap
import re
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchlower.errors import InvalidArgumentError

PAGE = mmap.PAGESIZE


class NotStreamable(Exception):
    """The checkpoint cannot be mapped (not all-f32 safetensors); load it normally."""


@dataclass
class _Mapped:
    memory: mmap.mmap
    start: int  # byte offset in the file
    length: int


class Mapping:
    """The memory maps behind a model's parameters; ``release`` drops a tensor's resident pages."""

    def __init__(self) -> None:
        self.files: list[tuple[Any, mmap.mmap]] = []
        self.by_pointer: dict[int, _Mapped] = {}
        self._bases: list[tuple[int, int, mmap.mmap]] = []
        self.unused: list[str] = []  # checkpoint tensors no parameter or buffer of the model took

    def tensor(
        self, path: Path, key: str, meta: dict[str, Any], data_start: int, memory: mmap.mmap
    ) -> torch.Tensor:
        if meta["dtype"] != "F32":
            raise NotStreamable(f"{path}: {key} is {meta['dtype']}, not F32")
        begin, end = meta["data_offsets"]
        shape = [int(d) for d in meta["shape"]]
        count = (end - begin) // 4
        if count == 0:
            return torch.zeros(shape)
        flat = torch.frombuffer(memory, dtype=torch.float32, count=count, offset=data_start + begin)
        out = flat.reshape(shape)
        self.by_pointer[out.data_ptr()] = _Mapped(memory, data_start + begin, end - begin)
        return out

    def release(self, data: Any) -> None:
        """Drop the resident pages under a mapped tensor or a memoryview of one (data stays valid:
        the private map re-reads the file on the next access)."""
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        if isinstance(data, torch.Tensor):
            start, length = data.data_ptr(), data.numel() * data.element_size()
        elif isinstance(data, memoryview) and data.nbytes >= PAGE:
            import numpy as np

            start, length = np.frombuffer(data, dtype=np.uint8).ctypes.data, data.nbytes
        else:
            return
        for base, size, memory in self.bases():
            if base <= start < base + size:
                first = (start - base + PAGE - 1) // PAGE * PAGE  # whole pages inside only
                last = (start - base + length) // PAGE * PAGE
                if last > first:
                    memory.madvise(mmap.MADV_DONTNEED, first, last - first)
                return

    def bases(self) -> list[tuple[int, int, mmap.mmap]]:
        if len(self._bases) != len(self.files):
            import ctypes

            self._bases = [
                (ctypes.addressof(ctypes.c_char.from_buffer(m)), len(m), m) for _h, m in self.files
            ]
        return self._bases

    def release_all(self) -> None:
        """Drop every resident page of the checkpoint (after a step that read the whole model)."""
        if hasattr(mmap, "MADV_DONTNEED"):
            for _handle, memory in self.files:
                memory.madvise(mmap.MADV_DONTNEED)

    def close(self) -> None:
        self.by_pointer.clear()
        for handle, _memory in self.files:
            handle.close()  # the maps close when the last tensor viewing them is gone
        self.files.clear()


def read_header(path: Path) -> tuple[dict[str, Any], int]:
    """The safetensors JSON header and the offset where tensor data starts."""
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise InvalidArgumentError(f"{path}: too short to be a safetensors file")
        (size,) = struct.unpack("<Q", raw)
        if size > 100_000_000 or size > path.stat().st_size:
            raise InvalidArgumentError(f"{path}: not a safetensors file (header size {size})")
        header = json.loads(f.read(size))
    header.pop("__metadata__", None)
    return header, 8 + size


@contextmanager
def empty_parameters() -> Iterator[None]:
    """Modules built inside get their parameters on ``meta`` (buffers stay real)."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        if param is not None:
            param = nn.Parameter(param.to("meta"), requires_grad=False)
        original(module, name, param)

    nn.Module.register_parameter = register  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def mapped_model(files: list[Path], config: Any, cls: Any = None) -> tuple[nn.Module, Mapping]:
    """The causal LM (or ``cls``, a transformers model class: a multimodal LM) with every
    parameter viewing the checkpoint; raises ``NotStreamable``."""
    import transformers

    if any(f.suffix != ".safetensors" for f in files):
        raise NotStreamable("not safetensors")
    mapping = Mapping()
    tensors: dict[str, torch.Tensor] = {}
    for path in files:
        header, start = read_header(path)
        handle = path.open("rb")
        memory = mmap.mmap(
            handle.fileno(), 0, access=mmap.ACCESS_COPY
        )  # private: writes never reach the file
        mapping.files.append((handle, memory))
        for key, meta in header.items():
            tensors[key] = mapping.tensor(path, key, meta, start, memory)
    with empty_parameters():
        if cls is None:
            model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        else:
            model = cls._from_config(config, dtype=torch.float32)
    used = _assign(model, tensors)
    ignored = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or []]
    mapping.unused = sorted(k for k in tensors if k not in used and not any(p.search(k) for p in ignored))
    return model.eval(), mapping


def generation_config(model: nn.Module, folder: Path) -> None:
    """The folder's ``generation_config.json`` on the model, as ``from_pretrained`` sets it (the
    manifest's end-of-sequence ids come from it)."""
    if (folder / "generation_config.json").is_file() and getattr(model, "can_generate", lambda: False)():
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig.from_pretrained(str(folder), local_files_only=True)


def _assign(model: nn.Module, tensors: dict[str, torch.Tensor]) -> set[str]:
    """Put each checkpoint tensor in its parameter; tied parameters follow the tensor they share.
    Returns the checkpoint keys used."""
    params = dict(model.named_parameters(remove_duplicate=False))
    owners: dict[int, list[str]] = {}
    for name, p in params.items():
        owners.setdefault(id(p), []).append(name)
    used: set[str] = set()
    for names in owners.values():
        keys = [n for n in names if n in tensors] or [k for n in names for k in _aliases(n) if k in tensors]
        used.update(keys)
        source = tensors[keys[0]] if keys else None
        if source is None:
            raise NotStreamable(f"no checkpoint tensor for {names[0]}")
        shape = tuple(params[names[0]].shape)
        if tuple(source.shape) != shape:
            raise InvalidArgumentError(
                f"checkpoint tensor for {names[0]} has shape {tuple(source.shape)}, not {shape}"
            )
        value = nn.Parameter(source, requires_grad=False)
        for name in names:
            owner, _, attr = name.rpartition(".")
            model.get_submodule(owner)._parameters[attr] = value
    for name, buffer in list(model.named_buffers()):
        if name in tensors and tuple(tensors[name].shape) == tuple(buffer.shape):  # persistent, saved
            owner, _, attr = name.rpartition(".")
            model.get_submodule(owner)._buffers[attr] = tensors[name]
            used.add(name)
    return used


def _aliases(name: str) -> list[str]:
    """Checkpoint keys written without the base-model prefix (``model.``, ``transformer.``)."""
    _, _, rest = name.partition(".")
    return [rest] if rest else []

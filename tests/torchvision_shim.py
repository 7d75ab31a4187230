"""Make the CUDA-only torchvision wheel importable with the CPU torch (test environment only).

torchvision 0.28.0, the release pinned to torch 2.13.0, is on PyPI only as a CUDA build: its
``_C.so`` needs ``libc10_cuda.so`` and cannot load. torchvision then still registers fake
kernels for ``torchvision::nms`` / ``qnms`` at import, which fails unless those schemas exist —
and transformers imports torchvision when it is installed. Defining the two schemas first
(only when ``_C.so`` really cannot load) makes every model that uses no torchvision C++ op work.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

_LIBRARY: list[torch.library.Library] = []  # keeps the schemas registered


def install() -> None:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None or _LIBRARY:
        return
    native = next(Path(spec.origin).parent.glob("_C*.so"), None)
    if native is not None:
        try:
            torch.ops.load_library(str(native))
            return  # a build that matches this torch: nothing to bypass
        except (OSError, RuntimeError):
            pass
    lib = torch.library.Library("torchvision", "DEF")
    lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _LIBRARY.append(lib)


def install_torchaudio() -> None:
    """torchaudio 2.11 (the release beside torch 2.13.0) is a CUDA build too: its ``_torchaudio``
    library cannot load. Its loader is told the extension is absent before the package imports,
    so the pure-PyTorch parts (``transforms``, ``functional``) work, as on a CPU-only install."""
    import importlib.util
    import sys
    import types

    spec = importlib.util.find_spec("torchaudio")
    if spec is None or spec.origin is None or "torchaudio" in sys.modules:
        return
    root = Path(spec.origin).parent
    native = next((root / "lib").glob("_torchaudio*.so"), None)
    if native is not None:
        try:
            torch.ops.load_library(str(native))
            return  # a build that matches this torch
        except (OSError, RuntimeError):
            pass
    # the two packages as empty placeholders, so the loader module imports without running them
    for name, folder in (("torchaudio", root), ("torchaudio._extension", root / "_extension")):
        placeholder = types.ModuleType(name)
        placeholder.__path__ = [str(folder)]  # type: ignore[attr-defined]
        sys.modules[name] = placeholder
    try:
        utils = importlib.import_module("torchaudio._extension.utils")
        utils._load_lib = lambda lib: False  # the extension is absent, as without a CUDA runtime
    finally:
        del sys.modules["torchaudio"], sys.modules["torchaudio._extension"]
    importlib.import_module("torchaudio")

"""The exporters and runtimes being compared, behind one small interface each.

Exporters: torchlower (one per front end, ``check=False``), torch_to_nnef (TractNNEF target with
a local ``tract`` shim so it never downloads, ``check_io=False``) and ``torch.onnx.export``
(dynamo, its defaults). NNEF artifacts run in tract (Python package), ONNX in onnxruntime,
both single-threaded.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

T2N_TRACT_VERSION = "0.23.8"  # what the shim claims; archives run in the tract package (0.23.x)
EXPORTERS = ("tl-jit", "tl-export", "t2n", "onnx")
PAIRS = (("tl-jit", "t2n"), ("tl-export", "onnx"), ("tl-jit", "onnx"), ("tl-export", "t2n"))


@dataclass(frozen=True)
class Exporter:
    name: str
    runtime: str  # "tract" | "ort"
    export: Callable[[nn.Module, tuple[torch.Tensor, ...], Path], list[Path]]
    # a step the front end cannot avoid (jit.trace / torch.export), measured once per model:
    # with tl-jit for jit.trace and with onnx for torch.export, which always runs
    floor: Callable[[nn.Module, tuple[torch.Tensor, ...]], Any] | None = None


def names(count: int, stem: str) -> list[str]:
    return [f"{stem}_{i}" for i in range(count)]


def _torchlower(frontend: str) -> Callable[[nn.Module, tuple[torch.Tensor, ...], Path], list[Path]]:
    def run(model: nn.Module, args: tuple[torch.Tensor, ...], folder: Path) -> list[Path]:
        import torchlower
        from torchlower.pipeline import export as api

        if frontend not in api.FRONTENDS:
            raise RuntimeError(
                f"front end {frontend!r} not in torchlower.pipeline.export.FRONTENDS {api.FRONTENDS}"
            )
        path = folder / "model.nnef.tar"
        torchlower.export(
            model, args, path, frontend=frontend, check=False, input_names=names(len(args), "input")
        )
        return [path]

    return run


def tract_shim(folder: Path) -> Path:
    """An executable that prints ``tract 0.23.8``: torch_to_nnef then never downloads a CLI."""
    shim = folder / "tract"
    shim.write_text(f'#!/bin/sh\necho "tract {T2N_TRACT_VERSION}"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return shim


def _t2n(model: nn.Module, args: tuple[torch.Tensor, ...], folder: Path) -> list[Path]:
    from torch_to_nnef import TractNNEF, export_model_to_nnef

    target = TractNNEF(T2N_TRACT_VERSION, check_io=False, specific_tract_binary_path=tract_shim(folder))
    export_model_to_nnef(
        model, args, folder / "model.nnef", target, input_names=names(len(args), "input"),
        log_level=logging.WARNING, compression_level=0,
    )  # fmt: skip
    return [folder / "model.nnef.tar"]


def _onnx(model: nn.Module, args: tuple[torch.Tensor, ...], folder: Path) -> list[Path]:
    path = folder / "model.onnx"
    torch.onnx.export(
        model, args, str(path), dynamo=True, verbose=False, input_names=names(len(args), "input")
    )
    return [path, *([data] if (data := folder / "model.onnx.data").exists() else [])]


def _trace_floor(model: nn.Module, args: tuple[torch.Tensor, ...]) -> Any:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.trace(model, args, check_trace=False)


def _export_floor(model: nn.Module, args: tuple[torch.Tensor, ...]) -> Any:
    return torch.export.export(model, args)


def exporter(name: str) -> Exporter:
    if name == "tl-jit":
        return Exporter(name, "tract", _torchlower("jit"), _trace_floor)
    if name == "tl-export":
        return Exporter(name, "tract", _torchlower("export"))
    if name == "t2n":
        return Exporter(name, "tract", _t2n)
    if name == "onnx":
        return Exporter(name, "ort", _onnx, _export_floor)
    raise ValueError(f"unknown exporter {name!r}; choose from {EXPORTERS}")


# ---- runtimes --------------------------------------------------------------------------------
class Loaded:
    """A loaded artifact: ``run(inputs) -> outputs`` and how long each loading step took."""

    def __init__(
        self, run: Callable[[Sequence[np.ndarray]], list[np.ndarray]], steps: dict[str, float]
    ) -> None:
        self.run, self.steps = run, steps


def load(runtime: str, artifact: Path, clock: Callable[[], float]) -> Loaded:
    return _load_tract(artifact, clock) if runtime == "tract" else _load_ort(artifact, clock)


_NNEF: Any = None


def _load_tract(artifact: Path, clock: Callable[[], float]) -> Loaded:
    global _NNEF
    import tract

    if _NNEF is None:
        _NNEF = tract.nnef().with_tract_extra().with_tract_transformers()
    t0 = clock()
    model = _NNEF.load(str(artifact))
    t1 = clock()
    runnable = model.into_runnable()  # declutter + optimize
    t2 = clock()

    def run(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return [t.to_numpy() for t in runnable.run(list(inputs))]

    return Loaded(run, {"parse": t1 - t0, "optimize": t2 - t1})


def _load_ort(artifact: Path, clock: Callable[[], float]) -> Loaded:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    t0 = clock()
    session = ort.InferenceSession(str(artifact), options, providers=["CPUExecutionProvider"])
    t1 = clock()
    feeds = [i.name for i in session.get_inputs()]

    def run(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return list(session.run(None, dict(zip(feeds, inputs, strict=True))))

    return Loaded(run, {"session": t1 - t0})


def single_threaded_env() -> dict[str, str]:
    """Environment for worker processes: one thread everywhere, offline."""
    return dict(
        os.environ,
        RAYON_NUM_THREADS="1",
        TRACT_FLASH_SDPA_ST="1",
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        TRANSFORMERS_VERBOSITY="error",
        PYTHONWARNINGS="ignore",
    )

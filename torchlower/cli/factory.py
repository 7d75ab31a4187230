"""Building the user's model from ``MODULE:FACTORY`` and, optionally, a weights file.

``MODULE`` is a dotted module name (importable from the current folder) or a path to a ``.py``
file; ``FACTORY`` a function or class (dotted attributes allowed) called without arguments.
A saved TorchScript file (``model.jit``, as silero-vad ships) is loaded with ``torch.jit.load``;
``model.jit:_model`` picks a submodule of it.
Weights are read with ``torch.load(weights_only=True)`` (tensors only, no code runs) or from
``.safetensors``; a full pickle needs ``--trust`` because unpickling can run arbitrary code.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from torchlower.cli.failures import usage_error


def build_model(spec: str, weights: str | None = None, trust: bool = False) -> Any:
    """The ``nn.Module`` named by ``spec`` with ``weights`` loaded into it."""
    from torch import nn

    scripted = _torchscript(spec)
    if scripted is not None:
        if weights is not None:
            load_weights(scripted, weights, trust)
        return scripted
    module_name, _, attr = spec.rpartition(":")
    if not module_name or not attr:
        raise usage_error(
            f"model {spec!r} is not of the form MODULE:FACTORY",
            "write e.g. mypkg.models:make_net or path/to/file.py:Net (a function or class returning"
            " the model).",
        )
    factory = _attribute(_import(module_name), attr, spec)
    if not callable(factory):
        raise usage_error(f"{spec}: {attr!r} is a {type(factory).__name__}, not a function or class")
    try:
        model = factory()
    except Exception as exc:
        raise usage_error(
            f"{spec}: calling {attr}() raised {type(exc).__name__}: {exc}",
            "the factory must build the model without arguments; wrap it in a small function.",
        ) from exc
    if not isinstance(model, nn.Module):
        raise usage_error(f"{spec}: {attr}() returned a {type(model).__name__}, not a torch.nn.Module")
    if weights is not None:
        load_weights(model, weights, trust)
    return model


def _torchscript(spec: str) -> Any:
    """The module of a saved TorchScript file ``spec`` (``PATH`` or ``PATH:sub.module``), else None.

    A TorchScript archive is a zip holding ``code/`` and ``constants.pkl``; ``torch.jit.load``
    reads it with TorchScript's own restricted unpickler (no arbitrary Python runs)."""
    import zipfile

    path, _, attr = spec.partition(":") if not Path(spec).is_file() else (spec, "", "")
    if not Path(path).is_file() or not zipfile.is_zipfile(path):
        return None
    with zipfile.ZipFile(path) as archive:
        if not any(n.split("/", 1)[-1].startswith("code/") for n in archive.namelist()):
            return None
    import torch

    try:
        module = torch.jit.load(path, map_location="cpu")
    except Exception as exc:
        raise usage_error(f"{path}: torch.jit.load failed: {type(exc).__name__}: {exc}") from exc
    for name in [a for a in attr.split(".") if a]:
        if not hasattr(module, name):
            children = ", ".join(n for n, _ in module.named_children()) or "none"
            raise usage_error(f"{spec}: the TorchScript module has no {name!r} (submodules: {children})")
        module = getattr(module, name)
    return module


def _import(name: str) -> Any:
    if name.endswith(".py"):
        path = Path(name)
        if not path.is_file():
            raise usage_error(f"model file {name!r} does not exist")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules.setdefault(path.stem, module)
        _run_user_code(lambda: spec.loader.exec_module(module), name)  # type: ignore[union-attr]
        return module
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, "")  # like `python -m`: modules in the current folder are importable
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and name.startswith(exc.name):
            raise usage_error(
                f"cannot import module {name!r}: {exc}",
                "run from the folder that holds it, set PYTHONPATH, or give a file: path/to/file.py:factory.",
            ) from exc
        raise usage_error(f"importing {name!r} failed: {exc}") from exc
    except Exception as exc:
        raise usage_error(f"importing {name!r} raised {type(exc).__name__}: {exc}") from exc


def _run_user_code(run: Any, name: str) -> None:
    try:
        run()
    except Exception as exc:
        raise usage_error(f"importing {name!r} raised {type(exc).__name__}: {exc}") from exc


def _attribute(module: Any, attr: str, spec: str) -> Any:
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(module) if not n.startswith("_"))[:12]
            raise usage_error(
                f"{spec}: module {module.__name__!r} has no attribute {attr!r}",
                f"names it defines include: {', '.join(public) or '(none)'}.",
            )
        obj = getattr(obj, part)
    return obj


def load_weights(model: Any, path: str, trust: bool) -> None:
    """Load a state dict from ``path`` into ``model`` (strict: every key must match)."""
    import pickle

    import torch

    file = Path(path)
    if not file.is_file():
        raise usage_error(f"weights file {path!r} does not exist")
    if file.suffix == ".safetensors":
        from safetensors.torch import load_file

        state: Any = load_file(str(file))
    else:
        try:
            state = torch.load(file, map_location="cpu", weights_only=not trust)
        except pickle.UnpicklingError as exc:
            raise usage_error(
                f"{path}: holds Python objects besides tensors, which torch.load(weights_only=True)"
                f" refuses ({str(exc).splitlines()[0]})",
                "save only the state dict (torch.save(model.state_dict(), f)); or, if you trust the"
                " file's author, pass --trust: unpickling it can run arbitrary code.",
            ) from exc
        except Exception as exc:
            raise usage_error(f"{path}: not a readable torch file ({type(exc).__name__}: {exc})") from exc
    if isinstance(state, torch.nn.Module):
        state = state.state_dict()
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise usage_error(f"{path}: holds a {type(state).__name__}, not a state dict")
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        raise usage_error(
            f"{path}: does not fit {type(model).__name__}: {' '.join(s.strip() for s in first[:3])}",
            "the factory must build the same architecture the weights were saved from.",
        ) from exc

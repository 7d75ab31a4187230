"""One checked export per LLM kind for the whole test session (tiny random configs).

Exports cost seconds each (tracing, Hugging Face and tract runs); the per-model test modules
and the every-command matrix (``test_archive_kinds.py``) read the same folder and archive. Each
kind's tests carry ``pytest.mark.xdist_group(kind)`` so ``--dist loadgroup`` runs them on one
worker, which then exports once. Every export bundles its samples (``io_samples=True``), which
``torchlower check`` compares with; Whisper's bundles its front end (``frontend=True``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests import llm_models, speech_models, vlm_models

SPEECH = ("whisper", "speech2text", "moonshine")
MULTIMODAL = ("llava", "idefics3", "qwen2_vl", "gemma3", "qwen2_audio")
STATE_SPACE = ("mamba", "mamba2", "bamba", "jamba", "qwen3_next")


def _ssm_folder(kind: str) -> Callable[[Path], tuple[Path, Any]]:
    def write(path: Path) -> tuple[Path, Any]:
        model = llm_models.build_ssm(kind)
        model.save_pretrained(path)
        return path, model

    return write


def _llama_folder(path: Path) -> tuple[Path, Any]:
    model = llm_models.build("llama")
    model.save_pretrained(path)
    (path / "tokenizer.json").write_text(llm_models.tokenizer_json(160))
    return path, model


FOLDERS: dict[str, Callable[[Path], tuple[Path, Any]]] = {
    "llama": _llama_folder,
    **{k: getattr(speech_models, f"{k}_folder") for k in SPEECH},
    **{k: getattr(vlm_models, f"{k}_folder") for k in MULTIMODAL},
    **{k: _ssm_folder(k) for k in STATE_SPACE},
}


class Exports:
    """Folders and exports made once per session (per xdist worker), by kind."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        self._factory = factory
        self._folders: dict[str, tuple[Path, Any]] = {}
        self._exports: dict[str, Any] = {}

    def folder(self, kind: str) -> tuple[Path, Any]:
        """The ``save_pretrained`` folder of ``kind`` and the model it holds."""
        if kind not in self._folders:
            self._folders[kind] = FOLDERS[kind](self._factory.mktemp(kind) / "hf")
        return self._folders[kind]

    def exported(self, kind: str) -> Any:
        """``llm.export`` of the folder, checked, with its samples (an archive or a folder)."""
        if kind not in self._exports:
            from torchlower import llm

            folder = self.folder(kind)[0]
            single = kind == "llama" or kind in STATE_SPACE
            target = folder.parent / (f"{kind}.nnef.tgz" if single else f"{kind}_tract")
            # Whisper's with its log-mel front end (a third part for every command)
            self._exports[kind] = llm.export(folder, target, io_samples=True, frontend=kind == "whisper")
        return self._exports[kind]

"""LLM export for tract: Hugging Face causal LMs with an explicit KV cache (docs/llm.md).

``export`` writes the archive tract's ``detect_kv_cache`` transform and causal-LM runner expect;
``generate`` runs prefill + decode in tract. Heavy imports wait for the first call.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["ContextLengthError", "ExportReport", "SourceError", "WrongModelError", "export", "generate"]

if TYPE_CHECKING:
    from torchlower.llm.exporter import ExportReport, export
    from torchlower.llm.runner import ContextLengthError, generate
    from torchlower.llm.source import SourceError, WrongModelError


def __getattr__(name: str) -> Any:
    if name in ("export", "ExportReport"):
        from torchlower.llm import exporter as module

        return getattr(module, name)
    if name in ("generate", "ContextLengthError"):
        from torchlower.llm import runner

        return getattr(runner, name)
    if name in ("SourceError", "WrongModelError"):
        from torchlower.llm import source

        return getattr(source, name)
    raise AttributeError(f"module 'torchlower.llm' has no attribute {name!r}")

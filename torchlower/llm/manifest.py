"""The ``manifest.json`` of a multi-archive LLM export (speech encoder-decoder, multimodal LM),
read with a typed error naming the file: shared by their runners."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from torchlower.errors import ArtifactError

MANIFEST = "manifest.json"


def read_manifest(folder: Path, fmt: str) -> dict[str, Any]:
    """``folder``'s manifest, which must say ``"format": fmt``."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ArtifactError(f"{folder / MANIFEST}: not readable JSON ({exc})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != fmt:
        raise ArtifactError(f"{folder / MANIFEST}: not a {fmt} manifest (written by torchlower.llm.export)")
    return manifest

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


def part_path(folder: Path, manifest: dict[str, Any], part: str) -> Path:
    """The archive of ``part`` the manifest names; a missing one is an ``ArtifactError`` naming it."""
    entry = manifest.get(part)
    archive = entry.get("archive") if isinstance(entry, dict) else None
    if not isinstance(archive, str):
        raise ArtifactError(f"{folder / MANIFEST}: no archive for the {part!r} part")
    path = folder / archive
    if not path.is_file():
        raise ArtifactError(f"{path}: missing ({MANIFEST} names it as the {part} archive); export again")
    return path


def tract_load(nnef: Any, path: Path) -> Any:
    """``nnef.load(path)``; an archive tract cannot read is an ``ArtifactError`` naming it."""
    import tract

    try:
        return nnef.load(str(path))
    except tract.TractError as exc:
        first = str(exc).strip().split("\n\nStack backtrace")[0].replace("\n\nCaused by:\n", ": ")
        raise ArtifactError(f"{path}: tract cannot load it ({' '.join(first.split())})") from None

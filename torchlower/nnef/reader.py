"""Reading NNEF artifacts (directory, ``.nnef.tar``, ``.nnef.tgz``) as untrusted input.

Members are streamed into memory one at a time and never extracted unless a caller asks for a
private copy (``extracted``). Every rule below raises ``ArtifactError`` naming the member:

- names: no absolute paths, ``..``, backslashes, NUL/control characters, empty components,
  duplicates (after dropping a leading ``./``), or a file that is also used as a folder;
- types: regular files only (folders allowed, carry nothing); symlinks, hard links, devices,
  FIFOs, sparse files and anything else are refused, in archives and in directories alike;
- sizes (``Limits``): a member's declared size is checked before any byte of it is read, the
  decompressed stream is counted while it is read (gzip bombs stop at ``max_total_bytes``),
  and tar/pax extended headers are capped (they are buffered in memory by ``tarfile``).
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import re
import shutil
import stat
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from torchlower.errors import ArtifactError

GiB = 2**30
_TEMP_FOLDER = re.compile(r"(?:/[^\s/'\"]+)*/torchlower-artifact-[A-Za-z0-9_]+")


@dataclass(frozen=True)
class Limits:
    """Size limits of one artifact; see docs/reliability.md for why these numbers."""

    max_total_bytes: int = 16 * GiB  # decompressed tar stream / sum of directory files
    max_member_bytes: int = 4 * GiB + 128  # a .dat's data length is a u32, plus its header
    max_graph_bytes: int = 256 * 2**20  # graph.nnef / graph.quant text
    max_members: int = 100_000
    max_header_bytes: int = 1 * 2**20  # pax / GNU long-name headers (held in memory by tarfile)
    max_depth: int = 32  # path components


DEFAULT_LIMITS = Limits()
TEXT_MEMBERS = ("graph.nnef", "graph.quant")
# what torchlower bundles beside the graph (llm/bundle.py, llm/source.py): the model's configs,
# its tokenizer, a manifest, and I/O samples ``io/<name>.npz``; tract ignores all of them
BUNDLED_FILES = (
    "config.json",
    "generation_config.json",
    "preprocessor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "normalizer.json",
    "tokenizer.model",
    "manifest.json",
    "adapter_config.json",
)
SAMPLES_FOLDER = "io"
TEMP_PREFIX = "torchlower-artifact-"  # the private folders ``extracted`` makes


def is_bundled(name: str) -> bool:
    """A member torchlower writes beside the graph (config, tokenizer, manifest, ``io/*.npz``)."""
    folder, _, leaf = name.rpartition("/")
    return name in BUNDLED_FILES or (folder == SAMPLES_FOLDER and leaf.endswith(".npz") and len(leaf) > 4)


def shown_as(message: str, target: str | os.PathLike[str]) -> str:
    """``message`` with any private folder of ``extracted`` replaced by the user's path."""
    return _TEMP_FOLDER.sub(lambda _m: str(target), message)


def artifact_kind(path: Path) -> str:
    """``dir``, ``tgz`` or ``tar`` from what the path holds (not its name)."""
    if path.is_dir():
        return "dir"
    if not path.exists():
        raise ArtifactError(f"{path}: no such file or directory")
    if not path.is_file():
        raise ArtifactError(f"{path}: not a regular file or directory")
    with path.open("rb") as f:
        magic = f.read(2)
    return "tgz" if magic == b"\x1f\x8b" else "tar"


def read_members(path: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS) -> dict[str, bytes]:
    """Every member's bytes by normalized name, after all checks."""
    return dict(iter_members(path, limits))


def iter_members(
    path: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS
) -> Iterator[tuple[str, bytes]]:
    """(name, bytes) of each regular file of the artifact, checked, one at a time."""
    root = Path(path)
    kind = artifact_kind(root)
    walker = _dir_members(root, limits) if kind == "dir" else _tar_members(root, kind, limits)
    names = _NameBook(limits)
    for name, blob in walker:
        names.add_file(name)
        yield name, blob


@contextlib.contextmanager
def extracted(path: str | os.PathLike[str], limits: Limits = DEFAULT_LIMITS) -> Iterator[Path]:
    """A private (0700) temporary folder holding the checked members; always removed on exit."""
    tmp = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    try:
        base = tmp.resolve()
        for name, blob in iter_members(path, limits):
            dest = (tmp / name).resolve()
            if base not in dest.parents:  # defense in depth: names are already checked
                raise ArtifactError(f"{path}: member {name!r} would be written outside the folder")
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- names ---------------------------------------------------------------------------------
class _NameBook:
    """Duplicate and file-vs-folder conflicts across members; member count."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.files: set[str] = set()
        self.folders: set[str] = set()

    def add_file(self, name: str) -> None:
        if name in self.files:
            raise ArtifactError(f"member {name!r} appears twice (duplicate names are refused)")
        if name in self.folders:
            raise ArtifactError(f"member {name!r} is both a file and a folder")
        parts = name.split("/")
        for i in range(1, len(parts)):
            folder = "/".join(parts[:i])
            if folder in self.files:
                raise ArtifactError(f"member {name!r} lies under {folder!r}, which is a file")
            self.folders.add(folder)
        self.files.add(name)
        if len(self.files) > self.limits.max_members:
            raise ArtifactError(f"more than {self.limits.max_members} members (limit max_members)")


def check_name(raw: str, limits: Limits = DEFAULT_LIMITS) -> str:
    """The normalized member name, or ``ArtifactError`` saying which rule ``raw`` breaks."""
    if raw.startswith("/") or (len(raw) > 1 and raw[1] == ":"):
        raise ArtifactError(f"member {raw!r} has an absolute path")
    if "\\" in raw:
        raise ArtifactError(f"member {raw!r} contains a backslash")
    if any(ord(c) < 32 or ord(c) == 127 for c in raw):
        raise ArtifactError(f"member {raw!r} contains a control character")
    name = raw
    while name.startswith("./"):
        name = name[2:]
    name = name.rstrip("/")
    parts = name.split("/")
    if ".." in parts:
        raise ArtifactError(f"member {raw!r} climbs out of the archive with '..'")
    if not name or any(p in ("", ".") for p in parts):
        raise ArtifactError(f"member {raw!r} has an empty or '.' path component")
    if len(parts) > limits.max_depth:
        raise ArtifactError(f"member {raw!r} is nested deeper than {limits.max_depth} folders")
    return name


def _member_limit(name: str, limits: Limits) -> int:
    return limits.max_graph_bytes if name in TEXT_MEMBERS else limits.max_member_bytes


# ---- archives ------------------------------------------------------------------------------
class _Counted(io.RawIOBase):
    """A read-only stream that fails once more than ``cap`` bytes have been read through it."""

    def __init__(self, inner: IO[bytes], cap: int, what: str) -> None:
        self.inner, self.cap, self.what, self.count = inner, cap, what, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        want = min(len(buffer), 1 << 20)
        data = self.inner.read(want)
        self.count += len(data)
        if self.count > self.cap:
            raise ArtifactError(
                f"{self.what}: decompressed content exceeds {self.cap} bytes (limit max_total_bytes;"
                " a gzip bomb or a model larger than the limit)"
            )
        buffer[: len(data)] = data
        return len(data)


class _GuardedInfo(tarfile.TarInfo):
    """Refuses oversized pax/GNU extended headers before ``tarfile`` buffers them."""

    max_header_bytes = DEFAULT_LIMITS.max_header_bytes

    def _proc_member(self, tar: tarfile.TarFile) -> tarfile.TarInfo:  # type: ignore[override]
        special = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME)
        if (self.type in special or self.type == tarfile.GNUTYPE_LONGLINK) and (
            self.size > self.max_header_bytes
        ):
            raise ArtifactError(
                f"an extended tar header declares {self.size} bytes (limit max_header_bytes "
                f"{self.max_header_bytes})"
            )
        return super()._proc_member(tar)  # type: ignore[misc]


_BROKEN = (tarfile.TarError, gzip.BadGzipFile, zlib.error, EOFError, OSError, UnicodeError, ValueError)


def _tar_members(path: Path, kind: str, limits: Limits) -> Iterator[tuple[str, bytes]]:
    guarded = type("_Guarded", (_GuardedInfo,), {"max_header_bytes": limits.max_header_bytes})
    total = 0
    with path.open("rb") as raw:
        source: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="rb") if kind == "tgz" else raw
        stream = io.BufferedReader(_Counted(source, limits.max_total_bytes, str(path)), 1 << 16)
        try:
            with tarfile.open(fileobj=stream, mode="r|", tarinfo=guarded) as tar:
                for index, info in enumerate(tar):
                    if index >= limits.max_members:
                        raise ArtifactError(
                            f"{path}: more than {limits.max_members} members (limit max_members)"
                        )
                    name = _tar_check(path, info, limits)
                    if name is None:
                        continue
                    total += info.size
                    if total > limits.max_total_bytes:
                        raise ArtifactError(
                            f"{path}: members add up to more than {limits.max_total_bytes} bytes"
                            " (limit max_total_bytes)"
                        )
                    yield name, _read_exact(tar, info, path, name)
        except ArtifactError:
            raise
        except _BROKEN as exc:
            raise ArtifactError(
                f"{path}: not a readable {kind} archive ({type(exc).__name__}: {exc})"
            ) from None


def _tar_check(path: Path, info: tarfile.TarInfo, limits: Limits) -> str | None:
    """The normalized name of a regular member, None for a folder; raises for anything else."""
    try:
        name = check_name(info.name, limits)
    except ArtifactError as exc:
        if info.name.strip("/") in ("", ".") and info.isdir():
            return None  # the archive's root folder entry ("./")
        raise ArtifactError(f"{path}: {exc}") from None
    if info.isdir():
        return None
    if info.issym() or info.islnk():
        raise ArtifactError(f"{path}: member {name!r} is a {'symbolic' if info.issym() else 'hard'} link")
    if info.ischr() or info.isblk() or info.isfifo():
        raise ArtifactError(f"{path}: member {name!r} is a device or FIFO")
    if info.issparse() or not info.isreg():
        raise ArtifactError(f"{path}: member {name!r} is not a regular file (tar type {info.type!r})")
    limit = _member_limit(name, limits)
    if info.size > limit:
        raise ArtifactError(f"{path}: member {name!r} declares {info.size} bytes, over the limit of {limit}")
    return name


def _read_exact(tar: tarfile.TarFile, info: tarfile.TarInfo, path: Path, name: str) -> bytes:
    handle = tar.extractfile(info)
    if handle is None:
        raise ArtifactError(f"{path}: member {name!r} has no data")
    blob = handle.read(info.size)
    if len(blob) != info.size:
        raise ArtifactError(f"{path}: member {name!r} is truncated ({len(blob)} of {info.size} bytes)")
    return blob


# ---- directories ---------------------------------------------------------------------------
def _dir_members(root: Path, limits: Limits) -> Iterator[tuple[str, bytes]]:
    total = 0
    for name, full in _walk(root, "", limits):
        limit = _member_limit(name, limits)
        blob = _read_regular(full, name, limit)
        total += len(blob)
        if total > limits.max_total_bytes:
            raise ArtifactError(
                f"{root}: files add up to more than {limits.max_total_bytes} bytes (limit max_total_bytes)"
            )
        yield name, blob


def _walk(root: Path, prefix: str, limits: Limits) -> Iterator[tuple[str, Path]]:
    if prefix.count("/") >= limits.max_depth:
        raise ArtifactError(f"{root}: {prefix!r} is nested deeper than {limits.max_depth} folders")
    with os.scandir(root / prefix if prefix else root) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            name = f"{prefix}{entry.name}"
            check_name(name, limits)
            if entry.is_symlink():
                raise ArtifactError(f"{root}: {name!r} is a symbolic link")
            if entry.is_dir(follow_symlinks=False):
                yield from _walk(root, f"{name}/", limits)
            elif entry.is_file(follow_symlinks=False):
                yield name, Path(entry.path)
            else:
                raise ArtifactError(f"{root}: {name!r} is not a regular file (device, FIFO or socket)")


def _read_regular(full: Path, name: str, limit: int) -> bytes:
    """Read a regular file without following links; its size may not grow past ``limit``."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(full, flags)
    except OSError as exc:
        raise ArtifactError(f"{name!r}: cannot open ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ArtifactError(f"{name!r} is not a regular file")
        if st.st_size > limit:
            raise ArtifactError(f"{name!r} holds {st.st_size} bytes, over the limit of {limit}")
        blob = f.read(limit + 1)
    if len(blob) > limit:
        raise ArtifactError(f"{name!r} grew past the limit of {limit} bytes while being read")
    return blob

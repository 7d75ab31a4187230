"""Writing NNEF artifacts atomically and reproducibly (directory, ``.nnef.tar``, ``.nnef.tgz``).

Reproducible: members sorted, mtime 0, uid/gid 0, no owner names, a gzip header without file
name or time. Atomic: everything goes to a temporary sibling first, then ``os.replace``, so a
failed export never leaves a partial file and keeps any previous one.
"""

from __future__ import annotations

import gzip
import io
import os
import shutil
import struct
import tarfile
import tempfile
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from torchlower.core import progress
from torchlower.core.staging import move, publish_mode
from torchlower.errors import InvalidArgumentError
from torchlower.nnef import dat, quant

Weight = torch.Tensor | quant.BlockQuantized

ARCHIVE_SUFFIXES = (".nnef.tgz", ".tgz", ".tar.gz", ".nnef.tar", ".tar")


def archive_kind(path: Path) -> str:
    """``"tgz"``, ``"tar"`` or ``"dir"`` from the path's suffix."""
    name = path.name
    if name.endswith((".nnef.tgz", ".tgz", ".tar.gz")):
        return "tgz"
    if name.endswith(".tar"):
        return "tar"
    if name.endswith(".nnef") or path.is_dir():
        return "dir"
    raise InvalidArgumentError(
        f"cannot tell the artifact format of {str(path)!r}: use a name ending in .nnef.tgz, "
        ".nnef.tar or .nnef (a directory)"
    )


Chunks = tuple[bytes | memoryview, ...]


def members(
    graph: str,
    weights: Mapping[str, Weight],
    quant_text: str | None = None,
    extra: Mapping[str, bytes] | None = None,
    release: Callable[[memoryview], None] | None = None,
) -> Iterator[tuple[str, Chunks]]:
    """(path, chunks) of every file, sorted by path; a tensor's data chunk is a view of its buffer.

    ``extra`` files (bundled as-is: an LLM's config and tokenizer) must not shadow graph files.
    With ``release``, tensor data comes in pieces of 16 MiB that the writer hands to
    ``release(piece)`` once written (memory-mapped weights drop their pages as they go).
    """
    files: dict[str, object] = dict(extra or {})
    files["graph.nnef"] = graph
    if quant_text is not None:
        files["graph.quant"] = quant_text
    files.update({f"{label}.dat": tensor for label, tensor in weights.items()})
    for name in sorted(files):
        item = files[name]
        if isinstance(item, bytes):
            chunks: Chunks = (item,)
        elif isinstance(item, (str, quant.BlockQuantized)):
            chunks = (item.encode(),)  # text, or packed blocks (an eighth of f32 size)
        else:
            chunks = dat.parts(_to_numpy(item))  # type: ignore[arg-type]
        if release is not None and isinstance(item, torch.Tensor):
            chunks = (chunks[0], *_pieces(chunks[1]))  # the writer releases each piece once written
        yield name, chunks
        progress.advance(sum(len(c) if isinstance(c, bytes) else c.nbytes for c in chunks))
        del chunks, item  # the next tensor's chunks must not share the peak with this one


def weight_bytes(weight: Weight) -> int:
    """Bytes of tensor data a weight takes in the artifact (headers excluded)."""
    if isinstance(weight, quant.BlockQuantized):
        return weight.nbytes
    return weight.numel() * weight.element_size()


def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().contiguous().numpy()


def write(
    path: str | os.PathLike[str],
    graph: str,
    weights: Mapping[str, Weight],
    quant_text: str | None = None,
    extra: Mapping[str, bytes] | None = None,
    release: Callable[[memoryview], None] | None = None,
    huffman_only: bool = False,
) -> Path:
    """Write the artifact at ``path`` atomically; returns the final path.

    ``huffman_only`` compresses a ``.nnef.tgz`` with deflate's Huffman-only strategy: on float
    weights it saves as much as level 6 (the redundancy is in the exponent bytes, not in
    repeated strings) at a third of the time, which matters when the archive is gigabytes.
    """
    target = Path(path)
    kind = archive_kind(target)
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise InvalidArgumentError(f"output folder {str(folder)!r} does not exist")
    if not os.access(folder, os.W_OK):
        raise InvalidArgumentError(f"output folder {str(folder)!r} is not writable")
    total = len(graph) + sum(weight_bytes(t) for t in weights.values())
    total += sum(len(blob) for blob in (extra or {}).values())
    with progress.stage("writing", total=total, unit="bytes"):
        if kind == "dir":
            _write_directory(target, members(graph, weights, quant_text, extra, release), release)
        else:
            files = members(graph, weights, quant_text, extra, release)
            _write_tar(target, files, kind == "tgz", release, huffman_only)
    return target


_COPY_BUFFER = 1 << 20
_PIECE = 1 << 22  # released pieces of a memory-mapped tensor: at most this much of it resident


def _pieces(data: bytes | memoryview) -> list[memoryview]:
    view = memoryview(data).cast("B")
    return [view[i : i + _PIECE] for i in range(0, len(view), _PIECE)] or [view]


class _ChunkReader(io.RawIOBase):
    """A read-only file over chunks, handing out slices (views, not copies) to ``tarfile``."""

    def __init__(self, chunks: Chunks, done: Callable[[memoryview], None] | None = None) -> None:
        self._views = [memoryview(c).cast("B") for c in chunks]
        self._index = 0
        self._offset = 0
        self._done = done

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> memoryview | bytes:  # type: ignore[override]
        """Up to ``size`` bytes: a view inside one chunk, a small join across a chunk boundary."""
        pieces: list[memoryview] = []
        want = size if size >= 0 else sum(len(v) for v in self._views)
        while want > 0 and self._index < len(self._views):
            view = self._views[self._index]
            end = min(len(view), self._offset + want)
            if end > self._offset:
                pieces.append(view[self._offset : end])
                want -= end - self._offset
            self._offset = end
            if end == len(view):
                self._index, self._offset = self._index + 1, 0
                if self._done is not None:  # safe while tar still holds a slice: pages re-read
                    self._done(view)
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


def _size(chunks: Chunks) -> int:
    return sum(memoryview(c).nbytes for c in chunks)


def _write_tar(
    target: Path,
    files: Iterator[tuple[str, Chunks]],
    compress: bool,
    done: Callable[[memoryview], None] | None = None,
    huffman_only: bool = False,
) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as raw:
            stream: Any = raw
            if compress and huffman_only:
                stream = _HuffmanGzip(raw)
            elif compress:
                stream = gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6)
            with tarfile.open(
                fileobj=stream, mode="w", format=tarfile.USTAR_FORMAT, copybufsize=_COPY_BUFFER
            ) as tar:
                for name, chunks in files:
                    info = tarfile.TarInfo(name)
                    info.size, info.mtime, info.mode = _size(chunks), 0, 0o644
                    info.uid = info.gid = 0
                    info.uname = info.gname = ""
                    tar.addfile(info, _ChunkReader(chunks, done))
            if compress:
                stream.close()
        publish_mode(Path(tmp), directory=False)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class _HuffmanGzip:
    """A write-only gzip member (RFC 1952) deflated with ``Z_HUFFMAN_ONLY``.

    ``gzip.GzipFile`` fixes the strategy; this writes the same container by hand: a header
    without name or time (OS byte 255, as ``gzip`` writes it, so the bytes do not depend on
    the platform), raw deflate, then CRC-32 and length.
    """

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self._deflate = zlib.compressobj(1, zlib.DEFLATED, -zlib.MAX_WBITS, 9, zlib.Z_HUFFMAN_ONLY)
        self._crc = 0
        self._size = 0
        raw.write(b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff")

    def write(self, data: bytes | memoryview) -> int:
        self._crc = zlib.crc32(data, self._crc)
        self._size += memoryview(data).nbytes
        self._raw.write(self._deflate.compress(data))
        return memoryview(data).nbytes

    def tell(self) -> int:  # tarfile asks for the position in the uncompressed stream
        return self._size

    def close(self) -> None:
        self._raw.write(self._deflate.flush())
        self._raw.write(struct.pack("<II", self._crc, self._size & 0xFFFFFFFF))


def _write_directory(
    target: Path, files: Iterator[tuple[str, Chunks]], done: Callable[[memoryview], None] | None = None
) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        for name, chunks in files:
            file = tmp / name
            file.parent.mkdir(parents=True, exist_ok=True)
            with file.open("wb") as out:
                for chunk in chunks:
                    out.write(chunk)
                    if done is not None:
                        done(memoryview(chunk))
        publish_mode(tmp, directory=True)
        move(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

"""Writing an artifact where the user asked for it only once it is complete and checked: a
staging name beside the target, private permissions while written, one rename at the end.
Both targets (NNEF archives, lattice folders) write this way.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process umask (read by setting and restoring it: there is no getter)."""
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def publish_mode(path: Path, directory: bool) -> None:
    """Temporary files and folders are private (0600 / 0700) while written; the finished
    artifact gets the permissions a plain ``open()`` / ``mkdir`` would have given it."""
    os.chmod(path, (0o777 if directory else 0o666) & ~current_umask())


def move(source: Path, target: Path) -> None:
    """``source`` onto ``target``: one rename for a file; a directory goes aside first (POSIX
    cannot swap directories atomically, see docs/reliability.md)."""
    old = None
    if target.is_dir():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        os.replace(target, old)
    os.replace(source, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


_STAGED = itertools.count()


def target_of(path: Path) -> Path:
    """The user's path behind a ``staged`` name (itself otherwise): what messages should name."""
    stem, sep, name = path.name.partition("-checking-")
    return path.with_name(name) if sep and stem.startswith(".") else path


@contextlib.contextmanager
def staged(target: Path) -> Iterator[Path]:
    """A name beside ``target`` to write and check the artifact at, moved onto ``target`` when
    the block succeeds and deleted when it raises.

    Why: the check runs after writing, and an artifact that failed it must not be left where the
    user asked for one (nor replace a previous good one). Same folder, so the move is a rename.
    """
    staging = target.with_name(f".{os.getpid()}-{next(_STAGED)}-checking-{target.name}")
    try:
        yield staging
        move(staging, target)
    except BaseException:
        if staging.is_dir():
            shutil.rmtree(staging, ignore_errors=True)
        else:
            staging.unlink(missing_ok=True)
        raise

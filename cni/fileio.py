"""Replacing a file in one step, and making written files durable: the one way Plexus
writes its state files."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from pathlib import Path


def write_atomic(path: str | Path, data: bytes, mode: int = 0o600, fsync: bool = False) -> None:
    """Replace `path` with `data`: readers see the old file or the new one, never a part.

    The data goes to a temporary file beside `path` (named after this process and
    thread, so concurrent writers never share one), which is then renamed over it.
    `fsync` makes the file durable: its data before the rename, the rename after it
    (see make_durable). Raises OSError; no temporary file is left behind.
    """
    target = Path(path)
    partial = target.with_name(f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, mode)
        try:
            os.fchmod(fd, mode)  # exactly `mode`, whatever the umask
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(partial, target)
    except OSError:
        partial.unlink(missing_ok=True)
        raise
    if fsync:
        _fsync(target.parent)


def make_durable(paths: Iterable[str | Path]) -> None:
    """fsync each file that exists, then each of their directories once.

    After a crash the files are there with their whole contents: the data is on disk
    (the file's fsync) and so is its name (the directory's). Syncing several files
    written without `fsync` in one pass costs fewer journal commits than syncing each
    write. Raises OSError.
    """
    directories: dict[Path, None] = {}
    for path in map(Path, paths):
        try:
            _fsync(path)
        except FileNotFoundError:
            continue
        directories.setdefault(path.parent)
    for directory in directories:
        _fsync(directory)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

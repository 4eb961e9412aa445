"""Replacing a file in one step: the one way Plexus writes its state files."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_atomic(path: str | Path, data: bytes, mode: int = 0o600, fsync: bool = False) -> None:
    """Replace `path` with `data`: readers see the old file or the new one, never a part.

    The data goes to a temporary file beside `path` (named after this process and
    thread, so concurrent writers never share one), which is then renamed over it.
    `fsync` makes the data durable before the rename. Raises OSError; no temporary
    file is left behind.
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

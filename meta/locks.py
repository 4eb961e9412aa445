"""Per-container locks: ADD, DEL, CHECK and hot-plug of one container never interleave.

Two layers, taken in this order. ContainerLocks serializes the calls of one process
(the daemon's workers and its hot-plug worker). `file_lock` then excludes every other
process, thin-mode plugins and a daemon alike: an flock on one file per container
ID. A lock file holds nothing, so its holder may remove it (`remove_lock_file`); a
waiter that then gets the lock of the removed file sees that and locks the new one.
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


class ContainerLocks:
    """One in-process lock per container ID, dropped once nobody holds or waits for it."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    @contextmanager
    def hold(self, container_id: str) -> Iterator[None]:
        with self._guard:
            lock, users = self._locks.get(container_id, (threading.Lock(), 0))
            self._locks[container_id] = (lock, users + 1)
        lock.acquire()
        try:
            yield
        finally:
            lock.release()
            with self._guard:
                users = self._locks[container_id][1] - 1
                if users:
                    self._locks[container_id] = (lock, users)
                else:
                    del self._locks[container_id]


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive flock on `path`, creating the file if needed."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _is_linked(fd, path):
                yield
                return
        finally:
            os.close(fd)  # closing releases the flock
        # The holder removed the file while we waited: lock the one now at `path`.


def remove_lock_file(path: Path) -> None:
    """Remove a lock file; only while holding its lock, or while no one can (GC)."""
    path.unlink(missing_ok=True)


def _is_linked(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False

"""Per-container locks: ADD, DEL and hot-plug of one container never interleave.

They live in the process that runs the engine; in the daemon every call for a container
goes through the same process, so its calls and its hot-plug worker are serialized.
(GC's exclusion works across processes: it is a file lock, see Node.lock.)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class ContainerLocks:
    """One lock per container ID, dropped once nobody holds or waits for it."""

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

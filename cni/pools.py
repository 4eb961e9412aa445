"""Thread pools shared by all calls of a process, one per purpose, made on first use."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

_pools: dict[str, ThreadPoolExecutor] = {}
_guard = threading.Lock()


def shared_pool(name: str, size: int) -> ThreadPoolExecutor:
    """The process's pool called `name` (its threads are named after it)."""
    with _guard:
        pool = _pools.get(name)
        if pool is None:
            pool = _pools[name] = ThreadPoolExecutor(size, thread_name_prefix=name)
        return pool

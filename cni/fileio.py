"""Replacing a file in one step, and making written files durable: the one way Plexus
writes its state files."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
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
            if os.fstat(fd).st_mode & 0o7777 != mode:
                os.fchmod(fd, mode)  # exactly `mode`, whatever the umask (a no-op fchmod
                # still costs a journalled inode update: ~50 us of each write on ext4)
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
    """fsync each file that exists and each of their directories; see start_sync."""
    start_sync(paths).wait()


class PendingSync:
    """fsyncs under way: wait() returns once all are done, raising the first OSError."""

    def __init__(self, jobs: list[Future[None]]) -> None:
        self._jobs = jobs

    def wait(self) -> None:
        for job in self._jobs:
            job.result()


def start_sync(paths: Iterable[str | Path], after: Iterable[PendingSync] = ()) -> PendingSync:
    """Start fsyncing each file that exists and each of their directories, all at once,
    once the writes `after` are done (their errors are raised by wait()).

    After a crash the files are there with their whole contents: the data is on disk
    (the file's fsync) and so is its name (the directory's). The fsyncs run in
    parallel because the file system commits concurrent ones together: measured here,
    3 files and 2 directories took ~5 ms in parallel against ~20 ms one after another
    (2026-12-02, a quieter disk: 1.0 against 1.2 ms, and with eleven files one job after
    another outlasted the ADD's PATCH);
    and in the background, so that the caller can do other work while the disk commits.
    A job waiting for `after` cannot hold up the writes it waits for: the pool takes its
    jobs in the order they came, and those writes came first.
    Syncing apart from writing, rather than each write syncing itself: fsyncs commit the
    file system's journal, and file creation elsewhere (host-local's leases, the next
    delegate's files) waits behind each commit: measured with eight in-process
    secondaries, the pod's ADD took ~3 ms longer with a sync in every write.
    """
    writes = list(after)
    files = [Path(p) for p in paths]
    directories = list(dict.fromkeys(f.parent for f in files))
    jobs = [_pool().submit(_after, writes, _fsync_if_there, f) for f in files]
    jobs += [_pool().submit(_after, writes, _fsync, d) for d in directories]
    return PendingSync(jobs)


def _after(writes: list[PendingSync], sync: Callable[[Path], None], path: Path) -> None:
    for write in writes:
        write.wait()
    sync(path)


def start_write(path: str | Path, data: bytes, mode: int = 0o600) -> PendingSync:
    """write_atomic(path, data, mode) on the sync pool: the caller goes on while the file
    system works (~0.2 ms to create and rename a file on ext4); wait() returns once the
    file is in place, raising its OSError. Not synced: hand it to start_sync's `after`."""
    return PendingSync([_pool().submit(write_atomic, path, data, mode)])


_POOL_SIZE = 8
_pool_guard = threading.Lock()


@functools.cache
def _shared_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(_POOL_SIZE, thread_name_prefix="fsync")


def _pool() -> ThreadPoolExecutor:
    """One pool per process, made on first use (the guard: functools.cache is not)."""
    with _pool_guard:
        return _shared_pool()


def _fsync_if_there(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        _fsync(path)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

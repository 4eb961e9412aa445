"""A plugin's stdin, stdout and stderr, exchanged within a timeout and a size, and its exit.

`Popen.communicate(timeout=...)` ends in `Popen.wait(timeout)`, which looks for the
child's exit between sleeps of 1, 2, 4... ms: ~1.1 ms per exec of a plugin that answers
at once (docs/performance.md). Here the exit is awaited on a pidfd, where there is one.
A plugin's stdout and stderr are each read up to MAX_OUTPUT: the daemon holds them in
memory, and a plugin is not trusted to print little.
"""

from __future__ import annotations

import os
import select
import selectors
import subprocess
import time
from collections.abc import Callable

from cni.callscope import kill_group

_CHUNK = 65536
MAX_OUTPUT = 8 << 20
"""Bytes read at most from each of a plugin's stdout and stderr (a result is a few KiB)."""


class OutputOverflow(Exception):
    """The child printed more than MAX_OUTPUT bytes on `stream` ("stdout" or "stderr");
    its process group was killed and it is reaped."""

    def __init__(self, stream: str) -> None:
        super().__init__(f"more than {MAX_OUTPUT >> 20} MiB on {stream}")
        self.stream = stream


def communicate(
    proc: subprocess.Popen[bytes],
    stdin: bytes,
    timeout: float | None,
    fed: Callable[[], None] = lambda: None,
) -> tuple[bytes, bytes, bool]:
    """Write `stdin`, read stdout and stderr to their end, reap `proc`: (stdout, stderr,
    expired). Once `timeout` has passed, `proc`'s process group is killed, what it wrote
    is still read, and `expired` is True. `fed` is called once `proc` has all of `stdin`
    (or has stopped reading it). Past MAX_OUTPUT bytes on stdout or stderr, `proc`'s
    process group is killed, `proc` reaped and OutputOverflow raised.

    As much of `stdin` as the pipe takes (a CNI config always fits) is written before
    anything else, so the plugin never waits for this thread to get the interpreter back.
    """
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    deadline = None if timeout is None else time.monotonic() + timeout
    out, err = proc.stdout.fileno(), proc.stderr.fileno()
    output = {out: bytearray(), err: bytearray()}
    pending = memoryview(stdin)
    if pending:
        os.set_blocking(proc.stdin.fileno(), False)
        pending = pending[_write(proc.stdin.fileno(), pending) :]
    if not pending:
        proc.stdin.close()
        fed()
    expired = False
    overflow = ""
    with selectors.DefaultSelector() as selector:
        for fd in output:
            selector.register(fd, selectors.EVENT_READ)
        if pending:
            selector.register(proc.stdin.fileno(), selectors.EVENT_WRITE)
        while selector.get_map() and not overflow:
            ready = selector.select(_left(deadline))
            if not ready:
                kill_group(proc)
                deadline, expired = None, True
            for key, _ in ready:
                if key.events & selectors.EVENT_WRITE:
                    pending = pending[_write(key.fd, pending) :]
                    if not pending:
                        selector.unregister(key.fd)
                        proc.stdin.close()
                        fed()
                elif chunk := os.read(key.fd, _CHUNK):
                    output[key.fd] += chunk
                    if len(output[key.fd]) > MAX_OUTPUT:
                        kill_group(proc)
                        overflow = "stdout" if key.fd == out else "stderr"
                        break
                else:
                    selector.unregister(key.fd)
    if not _exits_within(proc, _left(deadline)):
        kill_group(proc)
        expired = True
    proc.wait()
    proc.stdout.close()  # a writer that escaped the group now gets EPIPE
    proc.stderr.close()
    if overflow:
        raise OutputOverflow(overflow)
    return bytes(output[out]), bytes(output[err]), expired


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(deadline - time.monotonic(), 0.0)


def _write(fd: int, data: memoryview) -> int:
    """Bytes taken off `data`: all of them once the plugin stopped reading (as Popen)."""
    try:
        return os.write(fd, data[:_CHUNK])
    except BlockingIOError:
        return 0
    except BrokenPipeError:
        return len(data)


def _exits_within(proc: subprocess.Popen[bytes], timeout: float | None) -> bool:
    """Whether `proc` has exited or does within `timeout` (None: no bound; the caller's
    wait then blocks)."""
    if timeout is None or proc.poll() is not None:
        return True
    try:
        pidfd = os.pidfd_open(proc.pid)
    except OSError:  # no pidfd before Linux 5.3; or reaped meanwhile by a cancellation
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        if proc.poll() is not None:  # reaped before the pidfd was opened: it is not ours
            return True
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(timeout * 1000))
    finally:
        os.close(pidfd)

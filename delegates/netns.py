"""Run code inside a network namespace on the calling thread.

`setns` changes only the calling thread: `run_in_netns` moves this thread into the
namespace, runs the function and moves the thread back to the namespace it came from
(held open by descriptor, so the way back cannot vanish). Sockets opened inside (for
example a delegates.rtnl socket) stay bound to that namespace; threads and processes
started inside start there. No thread is spawned: measured under load, a fresh thread
per call spent ~20% of an in-process ADD waiting to be scheduled.
"""

from __future__ import annotations

import ctypes
import errno
import os
from collections.abc import Callable
from typing import TypeVar

from cni.errors import CNIError, ErrorCode

T = TypeVar("T")

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


class NetnsGone(CNIError):
    """The namespace path does not exist (anymore)."""


def open_netns(path: str) -> int:
    """An open descriptor of the namespace at `path`; NetnsGone if there is none."""
    try:
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise NetnsGone(
            ErrorCode.UNKNOWN_CONTAINER, f"network namespace {path} does not exist"
        ) from None
    except OSError as exc:
        raise CNIError(
            ErrorCode.IO_FAILURE, f"cannot open network namespace {path}", str(exc)
        ) from exc


def _setns(fd: int, path: str) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        code = ErrorCode.UNKNOWN_CONTAINER if err == errno.EINVAL else ErrorCode.IO_FAILURE
        raise CNIError(code, f"cannot enter network namespace {path}", os.strerror(err))


def run_in_netns(path: str, fn: Callable[[], T]) -> T:
    """Call `fn` on this thread inside the network namespace at `path`."""
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        target = open_netns(path)
        try:
            _setns(target, path)
        finally:
            os.close(target)
        try:
            return fn()
        finally:
            _return_home(home)
    finally:
        os.close(home)


def _return_home(home: int) -> None:
    """Back to the thread's own namespace. Failing that, this thread would run whatever
    comes next (execs, other calls) in a pod's namespace: stop the process instead."""
    if _libc.setns(home, CLONE_NEWNET) != 0:
        err = os.strerror(ctypes.get_errno())
        os.write(2, f"plexus: cannot return to the home network namespace: {err}\n".encode())
        os.abort()


def netns_exists(path: str) -> bool:
    """True if `path` names an existing namespace file."""
    return bool(path) and os.path.exists(path)

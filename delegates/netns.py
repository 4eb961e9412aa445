"""Run code inside a network namespace without touching the caller's thread.

`setns` changes only the calling thread, so each call gets a fresh thread that
enters the namespace, runs the function and exits; sockets opened there (for
example a delegates.rtnl socket) stay bound to that namespace.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
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


def _enter(path: str) -> None:
    fd = open_netns(path)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            code = ErrorCode.UNKNOWN_CONTAINER if err == errno.EINVAL else ErrorCode.IO_FAILURE
            raise CNIError(code, f"cannot enter network namespace {path}", os.strerror(err))
    finally:
        os.close(fd)


def run_in_netns(path: str, fn: Callable[[], T]) -> T:
    """Call `fn` on a new thread inside the network namespace at `path`."""
    box: dict[str, object] = {}

    def target() -> None:
        try:
            _enter(path)
            box["value"] = fn()
        except BaseException as exc:  # handed back to the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"netns:{os.path.basename(path)}")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def netns_exists(path: str) -> bool:
    """True if `path` names an existing namespace file."""
    return bool(path) and os.path.exists(path)

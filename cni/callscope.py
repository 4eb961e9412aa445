"""What bounds the plugin execs of one CNI call: a timeout per exec, and cancellation.

The daemon opens a scope per connection and cancels it when the shim's connection
vanishes (the runtime gave up on the call); cni.invoke consults the current scope on
every exec. Cancelling kills the ADD/CHECK plugins running now, with their process
groups, and refuses the ones started later. DEL and GC still run: they are the rollback.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from cni.errors import CNIError, ErrorCode

_ROLLBACK_VERBS = frozenset({"DEL", "GC"})


class CallScope:
    """One call's bounds, shared by every plugin it execs (on the call's thread)."""

    def __init__(self) -> None:
        self.timeout: float | None = None
        self.wrapper = ""
        """The Plexus shim, if installed (named as seen from here): `wrapper --exec-delegate
        PID ROOT PLUGIN` execs the plugin chrooted at ROOT so that it dies with the thread
        that forked it (meta/shim/shim.c)."""
        self.root = ""
        """The host's / as seen from here (a daemon's chrootDir, no trailing slash): where
        in-process IPAM keeps its state, as the plugins exec'd chrooted there do."""
        self.cancelled = ""
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen[bytes]] = set()
        self._exec_watchers: list[threading.Event] = []

    def on_host(self, path: str) -> str:
        """`path`, absolute as a config names it on the host (an in-process plugin's
        dataDir, resolvConf), as this process sees it: under `root`."""
        return self.root + path

    def cancel(self, reason: str) -> None:
        with self._lock:
            self.cancelled = reason
            for proc in self._running:
                kill_group(proc)

    def argv(self, binary: str, root: str) -> list[str]:
        """How to exec `binary` chrooted at `root` ("": not chrooted): through the wrapper
        when there is one, else by chroot(8) when there is a root."""
        if self.wrapper:
            return [self.wrapper, "--exec-delegate", str(os.getpid()), root or "/", binary]
        if root:
            return [shutil.which("chroot") or "/usr/sbin/chroot", root, binary]
        return [binary]

    def check(self, plugin_type: str, command: str) -> None:
        """Raise, as that plugin's failure, if the call is cancelled (rollback verbs excepted)."""
        if self.cancelled and command not in _ROLLBACK_VERBS:
            raise CNIError(
                ErrorCode.TRY_AGAIN_LATER, f"plugin {plugin_type} cancelled: {self.cancelled}"
            )

    def watch_next_exec(self, event: threading.Event) -> None:
        """Set `event` once this call's next exec'd plugin has its stdin (`fed`)."""
        with self._lock:
            self._exec_watchers.append(event)

    def fed(self) -> None:
        """The plugin exec'd last has all of its stdin: set the events waiting for it."""
        with self._lock:
            watchers, self._exec_watchers = self._exec_watchers, []
        for event in watchers:
            event.set()

    @contextmanager
    def running(self, proc: subprocess.Popen[bytes], command: str) -> Iterator[None]:
        """While `proc` runs, a cancellation kills it (unless it is a rollback)."""
        if command in _ROLLBACK_VERBS:
            yield
            return
        with self._lock:
            self._running.add(proc)
            if self.cancelled:
                kill_group(proc)
        try:
            yield
        finally:
            with self._lock:
                self._running.discard(proc)


_current: contextvars.ContextVar[CallScope | None] = contextvars.ContextVar(
    "cni_call_scope", default=None
)


@contextmanager
def call_scope() -> Iterator[CallScope]:
    """The current call's scope: the enclosing one (the daemon connection's), else a new one."""
    enclosing = _current.get()
    if enclosing is not None:
        yield enclosing
        return
    scope = CallScope()
    token = _current.set(scope)
    try:
        yield scope
    finally:
        _current.reset(token)


def current() -> CallScope:
    """The scope of the call running on this thread (an unbounded one outside any call)."""
    return _current.get() or CallScope()


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL `proc`'s process group (it leads one) unless it was already reaped."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

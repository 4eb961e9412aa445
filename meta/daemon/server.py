"""The unix-socket server the shim talks to.

Each connection carries one CNI call (see protocol.py), read on a thread of its own
(reused: cni/threads.py) within one deadline for the whole request, so an idle or
trickling client holds nothing but its thread. Only then does the call wait for one of
`max_concurrent_requests` worker slots. While it runs, a vanished shim (the runtime gave
up on the call) cancels it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from cni import callscope, skel
from cni.errors import CNIError, ErrorCode
from cni.threads import ReusedThreads
from meta.daemon import protocol
from meta.daemon.metrics import Metrics
from meta.plugin import MetaPlugin

log = logging.getLogger("plexus.daemon")

REQUEST_DEADLINE = 10.0
"""Seconds for a whole request to arrive; the shim sends it in one write."""
IDLE_CALL_THREADS = 16
"""Threads kept waiting for the next connection once their call is done."""


class SocketServer:
    """Serve CNI calls on `<socket_dir>/plexus.sock` (dir 0700, socket 0600, both root's)."""

    def __init__(
        self, socket_dir: str, plugin: MetaPlugin, metrics: Metrics, max_concurrent: int
    ) -> None:
        self.path = Path(socket_dir) / protocol.SOCKET_NAME
        self.plugin = plugin
        self.metrics = metrics
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._threads = ReusedThreads("cni-call", IDLE_CALL_THREADS)
        self._open = 0  # connections accepted and not yet done with
        self._closed = threading.Condition()
        self._stopping = threading.Event()
        self._drained = threading.Event()
        self._hangups = HangupWatch()
        self._sock: socket.socket | None = None
        self._inode = 0  # of the socket file we bound

    def bind(self) -> None:
        """Take over the socket dir, then create the socket with root-only permissions."""
        own_socket_dir(self.path.parent)
        self.path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        sock.listen(128)
        self._sock = sock
        self._inode = self.path.stat().st_ino
        log.info("listening", extra={"socket": str(self.path)})

    def serve_forever(self) -> None:
        """Accept until stop() (then what is already queued); each call gets a thread."""
        assert self._sock is not None, "bind() first"
        self._hangups.start()
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._stopping.is_set():
                    break
                raise
            with self._closed:
                self._open += 1
            self._threads.run(functools.partial(self._serve_one, conn))
        self._sock.close()
        self._drained.set()

    def stop(self, grace: float = 30.0) -> None:
        """Stop accepting and serve every call already made, in flight or queued, for up to
        `grace` seconds; shims arriving later find no socket and wait for the next daemon."""
        deadline = time.monotonic() + grace
        self._stopping.set()
        self._unlink_if_ours()
        if self._sock is not None:
            # accept() still returns the connections queued before this, then fails.
            self._sock.shutdown(socket.SHUT_RDWR)
            self._drained.wait(grace)
        with self._closed:
            self._closed.wait_for(lambda: self._open == 0, max(0.0, deadline - time.monotonic()))

    def _unlink_if_ours(self) -> None:
        """Remove the socket file unless a newer daemon (an upgrade surging beside this
        one) has bound its own there since: its shims must keep finding it."""
        with contextlib.suppress(FileNotFoundError):
            if self.path.stat().st_ino == self._inode:
                self.path.unlink()
                return
            log.info(
                "socket taken over by another daemon; left in place",
                extra={"socket": str(self.path)},
            )

    def _serve_one(self, conn: socket.socket) -> None:
        try:
            with conn:
                try:
                    request = protocol.read_request(_Deadline(conn, REQUEST_DEADLINE))
                    refuse_own_descendant(conn)
                except (CNIError, OSError) as exc:
                    self._answer_bad_request(conn, exc)
                    return
                conn.settimeout(None)
                with self.metrics.queued.track_inprogress():
                    self._slots.acquire()
                try:
                    code, out, verb = self._call(conn, request)
                finally:
                    self._slots.release()
                try:
                    conn.sendall(protocol.encode_response(code, out))
                except OSError as exc:
                    log.warning(
                        "shim went away before the answer", extra={"verb": verb, "error": str(exc)}
                    )
        finally:
            with self._closed:
                self._open -= 1
                self._closed.notify_all()

    def _call(self, conn: socket.socket, request: protocol.Request) -> tuple[int, bytes, str]:
        verb = request.env.get("CNI_COMMAND", "unknown")
        self.metrics.in_flight.inc()
        start = time.perf_counter()
        try:
            with callscope.call_scope() as scope, self._hangups.watch(conn, scope):
                code, out = skel.handle(self.plugin, request.env, request.stdin)
        finally:
            self.metrics.latency.labels(verb=verb).observe(time.perf_counter() - start)
            self.metrics.in_flight.dec()
        self.metrics.requests.labels(verb=verb, result="ok" if code == 0 else "error").inc()
        return code, out, verb

    def _answer_bad_request(self, conn: socket.socket, exc: Exception) -> None:
        error = (
            exc
            if isinstance(exc, CNIError)
            else CNIError(ErrorCode.IO_FAILURE, "reading the request failed", str(exc))
        )
        log.warning("bad request on the socket", extra={"error": str(error)})
        self.metrics.requests.labels(verb="invalid", result="error").inc()
        with contextlib.suppress(OSError):
            conn.sendall(protocol.encode_response(1, _error_json(error)))


class _Deadline:
    """A socket's reads under one deadline for all of them (a per-read timeout lets a
    client that sends a byte now and then hold its call open forever)."""

    def __init__(self, sock: socket.socket, seconds: float) -> None:
        self._sock = sock
        self._seconds = seconds
        self._end = time.monotonic() + seconds

    def recv(self, size: int) -> bytes:
        left = self._end - time.monotonic()
        try:
            if left <= 0:
                raise TimeoutError
            self._sock.settimeout(left)
            return self._sock.recv(size)
        except TimeoutError:
            raise TimeoutError(
                f"the request did not arrive whole within {self._seconds:g} s"
            ) from None


class HangupWatch:
    """One thread that cancels a running call when its shim's end of the socket closes.

    The shim shuts down its writing side once the request is sent, so EPOLLHUP (both
    sides shut) means the shim process is gone: the runtime killed it.
    """

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._calls: dict[int, callscope.CallScope] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="hangups", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @contextlib.contextmanager
    def watch(self, conn: socket.socket, scope: callscope.CallScope) -> Iterator[None]:
        fd = conn.fileno()
        with self._lock:
            self._calls[fd] = scope
            self._epoll.register(fd, select.EPOLLHUP | select.EPOLLONESHOT)
        try:
            yield
        finally:
            with self._lock:
                del self._calls[fd]
                self._epoll.unregister(fd)

    def _loop(self) -> None:
        while True:
            for fd, _ in self._epoll.poll():
                with self._lock:
                    scope = self._calls.get(fd)
                    # The event may be for a connection already closed whose fd now
                    # belongs to a new call: only a hangup seen now counts.
                    if scope is None or not _hung_up(fd):
                        continue
                log.warning("the shim went away: cancelling its call")
                scope.cancel("the runtime's shim closed the connection (it gave up on the call)")


_MAX_ANCESTORS = 64
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


def refuse_own_descendant(conn: socket.socket) -> None:
    """CNIError(INVALID_CONFIG) if the calling process descends from this daemon: a
    delegate it exec'd (or anything that one started) calling back into Plexus, which
    would run Plexus with a config of a NAD's choosing and wait on its own locks."""
    cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    pid = _PEERCRED.unpack(cred)[0]
    me = os.getpid()
    ancestor = pid
    for _ in range(_MAX_ANCESTORS):
        if ancestor <= 1:
            return
        if ancestor == me:
            raise CNIError(
                ErrorCode.INVALID_CONFIG,
                f"refused a call from process {pid}, which the Plexus daemon started: a "
                "delegate may not call Plexus again",
                "a network's plugin must not be Plexus itself (type plexus or its shim)",
            )
        ancestor = _parent(ancestor)


def _parent(pid: int) -> int:
    """The parent of `pid` (0 when it is gone): field 4 of /proc/PID/stat, after the
    command name, which may itself hold spaces and parentheses."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return 0
    return int(stat[stat.rindex(b")") + 2 :].split(b" ", 2)[1])


def _hung_up(fd: int) -> bool:
    probe = select.poll()
    probe.register(fd, select.POLLHUP)
    return any(event & select.POLLHUP for _, event in probe.poll(0))


def own_socket_dir(path: Path) -> None:
    """Create socketDir, or take it over: a real directory, root's, mode 0700.

    Anyone else who could write there could swap in a socket of their own and answer
    the runtime's calls; a symlink could point the socket anywhere. A directory holding
    anything but our socket is refused rather than locked up (socketDir set to /run).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            f"socketDir {path} is not a directory (a symlink is refused)",
            str(exc),
        ) from exc
    try:
        if others := sorted(set(os.listdir(fd)) - {protocol.SOCKET_NAME}):
            raise CNIError(
                ErrorCode.INVALID_CONFIG,
                f"socketDir {path} holds other files ({', '.join(others[:5])}): "
                "it must be a directory of its own",
            )
        os.fchown(fd, 0, 0)
        os.fchmod(fd, 0o700)
    except OSError as exc:
        raise CNIError(
            ErrorCode.IO_FAILURE, f"cannot make socketDir {path} root's with mode 0700", str(exc)
        ) from exc
    finally:
        os.close(fd)


def _error_json(error: CNIError) -> bytes:
    return json.dumps(error.to_dict("1.1.0")).encode()

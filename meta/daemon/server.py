"""The unix-socket server the shim talks to.

Each connection carries one CNI call (see protocol.py). At most
`max_concurrent_requests` run at once; past that the accept loop waits, so further
shims queue in the kernel's listen backlog instead of in our memory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from pathlib import Path

from cni import skel
from cni.errors import CNIError, ErrorCode
from meta.daemon import protocol
from meta.daemon.metrics import Metrics
from meta.plugin import MetaPlugin

log = logging.getLogger("plexus.daemon")

REQUEST_READ_TIMEOUT = 10.0


class SocketServer:
    """Serve CNI calls on `<socket_dir>/plexus.sock` (dir 0700, socket 0600)."""

    def __init__(
        self, socket_dir: str, plugin: MetaPlugin, metrics: Metrics, max_concurrent: int
    ) -> None:
        self.path = Path(socket_dir) / protocol.SOCKET_NAME
        self.plugin = plugin
        self.metrics = metrics
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._workers: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._sock: socket.socket | None = None

    def bind(self) -> None:
        """Create the socket dir and socket with root-only permissions."""
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.path.parent, 0o700)
        self.path.unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        old = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old)
        sock.listen(128)
        self._sock = sock
        log.info("listening", extra={"socket": str(self.path)})

    def serve_forever(self) -> None:
        """Accept until stop(); each call runs on its own thread."""
        assert self._sock is not None, "bind() first"
        while not self._stopping.is_set():
            self._slots.acquire()
            try:
                conn, _ = self._sock.accept()
            except OSError:
                self._slots.release()
                if self._stopping.is_set():
                    break
                raise
            worker = threading.Thread(target=self._serve_one, args=(conn,), daemon=True)
            with self._lock:
                self._workers.add(worker)
            worker.start()

    def stop(self, grace: float = 30.0) -> None:
        """Stop accepting, let in-flight calls finish (up to `grace` seconds), remove the socket."""
        self._stopping.set()
        if self._sock is not None:
            self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        self.path.unlink(missing_ok=True)
        deadline = time.monotonic() + grace
        with self._lock:
            workers = list(self._workers)
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))

    def _serve_one(self, conn: socket.socket) -> None:
        self.metrics.in_flight.inc()
        verb = "unknown"
        start = time.perf_counter()
        try:
            with conn:
                conn.settimeout(REQUEST_READ_TIMEOUT)
                try:
                    request = protocol.read_request(conn)
                except (CNIError, OSError) as exc:
                    self._answer_bad_request(conn, exc)
                    return
                conn.settimeout(None)
                verb = request.env.get("CNI_COMMAND", "unknown")
                code, out = skel.handle(self.plugin, request.env, request.stdin)
                self.metrics.requests.labels(verb=verb, result="ok" if code == 0 else "error").inc()
                try:
                    conn.sendall(protocol.encode_response(code, out))
                except OSError as exc:
                    log.warning(
                        "shim went away before the answer", extra={"verb": verb, "error": str(exc)}
                    )
        finally:
            self.metrics.latency.labels(verb=verb).observe(time.perf_counter() - start)
            self.metrics.in_flight.dec()
            with self._lock:
                self._workers.discard(threading.current_thread())
            self._slots.release()

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


def _error_json(error: CNIError) -> bytes:
    return json.dumps(error.to_dict("1.1.0")).encode()

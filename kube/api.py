"""A small Kubernetes API client over http.client: JSON requests and watch streams.

The official client is used only to load a kubeconfig or the in-cluster config (in a
child process: see kube/kubeconfig.py); requests go straight to the REST paths,
so objects stay plain dicts and a watch is one streamed response read line by line.
Requests share kept-alive connections (`_Connections`); each watch holds one of its own.
The stdlib's http.client, not urllib3 on top of it: a pods/status PATCH costs ~0.6 ms
less of the caller's time (docs/performance.md).
"""

from __future__ import annotations

import http.client
import json
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import urlsplit

from cni import jsonio
from cni.errors import CNIError, ErrorCode
from kube.kubeconfig import Credentials

IDLE_CONNECTIONS = 16
"""Kept-alive connections kept for the next requests (concurrent calls use more)."""
MAX_RESPONSE = 1 << 30
"""Bytes of one answer decoded: a list is not bounded by the server (a large cluster's
nodes are ~100 MB), so the nesting bound is what guards against objects tenants wrote."""


class APIError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


class KubeAPI:
    """Authenticated JSON access to one API server."""

    def __init__(self, kubeconfig: str = "", timeout: float = 10.0) -> None:
        cfg = Credentials(kubeconfig)
        self._cfg = cfg
        self.timeout = timeout
        self._connections = _Connections(cfg)

    def _headers(self, content_type: str = "application/json") -> dict[str, str]:
        if self._cfg.refresh_api_key_hook is not None:
            self._cfg.refresh_api_key_hook(self._cfg)
        headers = {
            "Accept": "application/json",
            "Content-Type": content_type,
            "User-Agent": f"plexus/{os.getpid()}",
        }
        token = self._cfg.get_api_key_with_prefix(
            "authorization"
        ) or self._cfg.get_api_key_with_prefix("BearerToken")
        if token:
            headers["Authorization"] = (
                token if token.lower().startswith("bearer ") else f"Bearer {token}"
            )
        return headers

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """One JSON request within `timeout` (connecting included, as far as the answer's
        first byte); APIError for a non-2xx status, ConnectionError when unreachable."""
        deadline = time.monotonic() + (timeout or self.timeout)
        data = None if body is None else json.dumps(body).encode()
        conn = self._connections.take(deadline)
        try:
            _bound(conn, deadline)
            conn.request(method, self._connections.prefix + path, data, self._headers(content_type))
            _bound(conn, deadline)
            response = conn.getresponse()
            payload = response.read()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise ConnectionError(f"{method} {path}: {_describe(exc)}") from exc
        self._connections.give_back(conn, response)
        text = payload.decode(errors="replace")
        if response.status >= 300:
            raise APIError(response.status, text)
        what = f"the API server's answer to {method} {path}"
        result: dict[str, Any] = jsonio.loads(text, what, MAX_RESPONSE) if text else {}
        return result

    def watch(self, path: str, timeout_seconds: int, stop: Stop) -> Iterator[dict[str, Any]]:
        """Events of a watch on `path` (which already holds its query) until the server ends
        it, or `stop` is set (the events end: a ConnectionError, or none more)."""
        conn = self._connections.connect(time.monotonic() + self.timeout)
        try:
            try:
                conn.request("GET", self._connections.prefix + path, headers=self._headers())
                conn.sock.settimeout(timeout_seconds + 30)
                with stop.ending(conn.sock):
                    yield from _events(conn, path)
            except (OSError, http.client.HTTPException) as exc:
                raise ConnectionError(f"watch {path}: {_describe(exc)}") from exc
        finally:
            conn.close()


class Stop(threading.Event):
    """A stop signal that ends the watches given it at once: set() shuts their sockets
    down, so a read blocked on one returns."""

    def __init__(self) -> None:
        super().__init__()
        self._socks: set[socket.socket] = set()
        self._guard = threading.Lock()

    def set(self) -> None:
        super().set()
        with self._guard:
            for sock in self._socks:
                _hang_up(sock)

    @contextmanager
    def ending(self, sock: socket.socket) -> Iterator[None]:
        """While in the block, set() hangs `sock` up (at once if it is set already)."""
        with self._guard:
            self._socks.add(sock)
        if self.is_set():
            _hang_up(sock)
        try:
            yield
        finally:
            with self._guard:
                self._socks.discard(sock)


def _hang_up(sock: socket.socket) -> None:
    """Shut the connection down under a read blocked on it (the plain socket's shutdown:
    a TLS socket's own would drop its TLS state under the reading thread)."""
    with suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


def _events(conn: http.client.HTTPConnection, path: str) -> Iterator[dict[str, Any]]:
    """The events of a watch's response, one JSON line each."""
    response = conn.getresponse()
    if response.status >= 300:
        raise APIError(response.status, response.read().decode(errors="replace"))
    buffer = b""
    while chunk := response.read1(65536):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield jsonio.loads(line, f"an event of watch {path}", MAX_RESPONSE)


def _bound(conn: http.client.HTTPConnection, deadline: float) -> None:
    """Let the socket's next reads wait only until `deadline`."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("timed out")
    conn.sock.settimeout(left)


class _Connections:
    """Kept-alive connections to the API server, the last used first. TLS is set up from
    the kubeconfig's files for each new connection, so rotated certificates count."""

    def __init__(self, cfg: Credentials) -> None:
        url = urlsplit(cfg.host)
        self._cfg = cfg
        self._tls = url.scheme == "https"
        self._host = url.hostname or ""
        self._port = url.port or (443 if self._tls else 80)
        self.prefix = url.path.rstrip("/")
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    def take(self, deadline: float) -> http.client.HTTPConnection:
        """An idle connection the server has not closed, else a new one."""
        while True:
            with self._lock:
                conn = self._idle.pop() if self._idle else None
            if conn is None:
                return self.connect(deadline)
            if _still_open(conn):
                return conn
            conn.close()

    def give_back(
        self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse
    ) -> None:
        """Keep `conn` for the next request unless the server is closing it."""
        with self._lock:
            if not response.will_close and len(self._idle) < IDLE_CONNECTIONS:
                self._idle.append(conn)
                return
        conn.close()

    def connect(self, deadline: float) -> http.client.HTTPConnection:
        timeout = max(deadline - time.monotonic(), 0.001)
        conn: http.client.HTTPConnection
        try:
            if self._tls:
                conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=timeout, context=self._context()
                )
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout)
            conn.connect()
        except OSError as exc:  # ssl.SSLError included
            raise ConnectionError(f"connecting to {self._cfg.host}: {_describe(exc)}") from exc
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _context(self) -> ssl.SSLContext:
        """The cluster's CA alone when it names one (the system's store only without)."""
        cfg = self._cfg
        if cfg.verify_ssl:
            context = ssl.create_default_context(cafile=cfg.ssl_ca_cert)
        else:  # insecure-skip-tls-verify
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if cfg.cert_file:
            context.load_cert_chain(cfg.cert_file, cfg.key_file)
        return context


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _still_open(conn: http.client.HTTPConnection) -> bool:
    """False once the server has closed an idle connection (it is then readable)."""
    if conn.sock is None:
        return False
    poller = select.poll()
    poller.register(conn.sock, select.POLLIN)
    return not poller.poll(0)


def get_object(api: KubeAPI, path: str) -> dict[str, Any] | None:
    """GET one object; None if it does not exist, code 11 if the server cannot answer."""
    try:
        return api.request("GET", path)
    except APIError as exc:
        if exc.status == 404:
            return None
        raise CNIError(ErrorCode.TRY_AGAIN_LATER, f"GET {path} failed", str(exc)) from exc
    except OSError as exc:
        raise CNIError(
            ErrorCode.TRY_AGAIN_LATER, "the API server is unreachable", str(exc)
        ) from exc

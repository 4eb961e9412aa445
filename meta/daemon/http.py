"""/healthz, /readyz and /metrics over HTTP.

One asyncio loop on one thread serves every connection, so idle clients cost a few
KiB each, not a thread; a request must arrive whole within REQUEST_DEADLINE, and at
most MAX_CONNECTIONS are open at once (more are closed at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

from meta.daemon.metrics import Metrics

REQUEST_DEADLINE = 5.0
MAX_CONNECTIONS = 256
MAX_REQUEST_HEAD = 8192
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 503: "Service Unavailable"}


class HealthServer:
    """Serves the endpoints on a background thread until shutdown()."""

    def __init__(
        self, address: str, port: int, metrics: Metrics, ready: Callable[[], bool]
    ) -> None:
        self.metrics = metrics
        self.ready = ready
        self._open = 0
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve, address, port, limit=MAX_REQUEST_HEAD)
        )
        self._thread = threading.Thread(target=self._loop.run_forever, name="http", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._server.close()
        self._loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open += 1
        try:
            if self._open <= MAX_CONNECTIONS:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_DEADLINE)
                writer.write(self._answer(head))
                await asyncio.wait_for(writer.drain(), REQUEST_DEADLINE)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the client went away, was too slow, or sent too much: just close
        finally:
            self._open -= 1
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    def _answer(self, head: bytes) -> bytes:
        method, _, rest = head.partition(b" ")
        path = rest.split(b" ", 1)[0].decode(errors="replace")
        content_type = "text/plain"
        if method != b"GET":
            status, body = 400, b"only GET\n"
        elif path == "/healthz":
            status, body = 200, b"ok\n"
        elif path == "/readyz":
            ok = self.ready()
            status, body = (200, b"ok\n") if ok else (503, b"not ready\n")
        elif path == "/metrics":
            # Imported on the first scrape: a node nobody scrapes never loads it (+1.5 MiB).
            from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

            status, body = 200, generate_latest(self.metrics.registry)
            content_type = CONTENT_TYPE_LATEST
        else:
            status, body = 404, b"not found\n"
        header = (
            f"HTTP/1.1 {status} {_REASONS[status]}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        return header.encode() + body

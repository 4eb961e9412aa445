"""/healthz, /readyz and /metrics over HTTP."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from meta.daemon.metrics import Metrics


def start_http(
    address: str, port: int, metrics: Metrics, ready: Callable[[], bool]
) -> ThreadingHTTPServer:
    """Serve the endpoints on a background thread; returns the server (for shutdown)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/healthz":
                self._reply(200, b"ok\n", "text/plain")
            elif self.path == "/readyz":
                ok = ready()
                self._reply(200 if ok else 503, b"ok\n" if ok else b"not ready\n", "text/plain")
            elif self.path == "/metrics":
                self._reply(200, generate_latest(metrics.registry), CONTENT_TYPE_LATEST)
            else:
                self._reply(404, b"not found\n", "text/plain")

        def _reply(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # probes every few seconds would drown the call logs

    server = ThreadingHTTPServer((address, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="http", daemon=True).start()
    return server

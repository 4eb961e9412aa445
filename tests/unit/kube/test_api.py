"""kube/api.py's transport: kept-alive connections, their loss, bounds, watches.

Against a FAKE API server (http.server on loopback, HTTP/1.1): these are the connection
behaviours a real kube-apiserver cannot be made to show on demand; the cluster tier
runs the same client against a real one.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kube.api import APIError, KubeAPI, Stop
from tests.unit.kube.test_kubeconfig import write_kubeconfig


class FakeAPIServer(BaseHTTPRequestHandler):
    """FAKE: answers `{"port": <client port>}`; /drop closes the connection after its
    answer without saying so; /hang answers only once the test ends; /missing is a 404;
    /watch streams two events in three chunks; /watch-hang one event, then nothing until
    the test ends."""

    protocol_version = "HTTP/1.1"
    server: ClosingServer

    def do_GET(self) -> None:
        self.server.tokens.append(self.headers.get("Authorization", ""))
        if self.path == "/hang":
            self.server.release.wait(10)
        if self.path == "/watch":
            self._chunked([b'{"type": "ADDED", "n"', b': 1}\n{"type": "MODIFIED",', b' "n": 2}\n'])
            return
        if self.path == "/watch-hang":
            event = b'{"type": "ADDED", "n": 1}\n'
            self._chunked([event], then=lambda: self.server.release.wait(10))
            return
        status = 404 if self.path == "/missing" else 200
        body = json.dumps({"port": self.client_address[1]}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = self.path == "/drop"

    def _chunked(self, chunks: list[bytes], then: Callable[[], object] = lambda: None) -> None:
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            self.wfile.flush()
            time.sleep(0.01)
        then()
        self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass


class ClosingServer(ThreadingHTTPServer):
    """The fake's state, one per test (an earlier test's handlers may still be finishing):
    `closed` is set once it has closed a connection (its FIN is sent), `release` ends the
    hanging answers, `tokens` are the requests' Authorization headers."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), FakeAPIServer)
        self.daemon_threads = True
        self.release = threading.Event()
        self.closed = threading.Event()
        self.tokens: list[str] = []

    def shutdown_request(self, request: Any) -> None:
        super().shutdown_request(request)
        self.closed.set()


@pytest.fixture
def server() -> Iterator[ClosingServer]:
    running = ClosingServer()
    threading.Thread(target=running.serve_forever, daemon=True).start()
    try:
        yield running
    finally:
        running.release.set()
        running.shutdown()
        running.server_close()


@pytest.fixture
def api(server: ClosingServer, tmp_path: Path) -> KubeAPI:
    config = write_kubeconfig(
        tmp_path / "kubeconfig",
        {"server": f"http://127.0.0.1:{server.server_address[1]}"},
        {"token": "secret"},
    )
    return KubeAPI(config)


def test_requests_share_one_kept_alive_connection(api: KubeAPI, server: ClosingServer) -> None:
    first, second = api.request("GET", "/a"), api.request("GET", "/b")

    assert first["port"] == second["port"]
    assert server.tokens == ["Bearer secret", "Bearer secret"]


def test_a_connection_the_server_closed_is_replaced_not_failed(
    api: KubeAPI, server: ClosingServer
) -> None:
    dropped = api.request("GET", "/drop")
    assert server.closed.wait(10)  # its FIN is in our socket (loopback)

    assert api.request("GET", "/after")["port"] != dropped["port"]


def test_a_server_that_does_not_answer_fails_within_the_bound(api: KubeAPI) -> None:
    started = time.monotonic()
    with pytest.raises(ConnectionError, match="timed out"):
        api.request("GET", "/hang", timeout=0.3)

    assert time.monotonic() - started < 2
    assert api.request("GET", "/next")["port"]  # the stuck connection was not kept


def test_a_non_2xx_answer_is_an_api_error_with_its_status(api: KubeAPI) -> None:
    with pytest.raises(APIError) as err:
        api.request("GET", "/missing")

    assert err.value.status == 404
    assert api.request("GET", "/next")["port"]


def test_a_watch_yields_each_line_of_a_chunked_stream(api: KubeAPI) -> None:
    events = list(api.watch("/watch", 5, Stop()))

    assert events == [{"type": "ADDED", "n": 1}, {"type": "MODIFIED", "n": 2}]


def test_stop_ends_a_watch_blocked_on_a_quiet_stream(api: KubeAPI) -> None:
    stop, events = Stop(), []
    started = time.monotonic()
    with pytest.raises(ConnectionError):  # the server never ended it: the events break off
        for event in api.watch("/watch-hang", 30, stop):
            events.append(event)
            threading.Timer(0.2, stop.set).start()

    assert events == [{"type": "ADDED", "n": 1}]
    assert time.monotonic() - started < 5  # not the 10 s the server would keep it open

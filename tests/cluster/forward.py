"""Make the API server (host loopback) reachable on the same port inside a node namespace.

The daemon under test runs in a private node namespace whose loopback is its own;
this forwards 127.0.0.1:<port> there to 127.0.0.1:<port> on the host, so the
kubeconfig (and its certificate's 127.0.0.1 SAN) works unchanged. `stop()` cuts
the line, which is how tests take the API server away from the daemon. With `listen`, the
relay answers on another address of the namespace instead (the `kubernetes` Service's
ClusterIP, which in-cluster clients dial, as kube-proxy would make it work).
"""

from __future__ import annotations

import contextlib
import socket
import threading

from delegates.netns import run_in_netns


class LoopbackForward:
    """A TCP relay from a namespace's loopback to the host's."""

    def __init__(self, netns_path: str, port: int, listen: tuple[str, int] | None = None) -> None:
        self.netns_path = netns_path
        self.port = port
        self.listen = listen or ("127.0.0.1", port)
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    def start(self) -> None:
        def listen() -> socket.socket:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(self.listen)
            sock.listen(64)
            return sock

        self._listener = run_in_netns(self.netns_path, listen)
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def stop(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            conns, self._conns = self._conns, []
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                inner, _ = listener.accept()
            except OSError:
                return
            try:
                outer = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            except OSError:
                inner.close()
                continue
            outer.settimeout(None)
            with self._lock:
                self._conns += [inner, outer]
            for src, dst in ((inner, outer), (outer, inner)):
                threading.Thread(target=_pump, args=(src, dst), daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := src.recv(65536):
            dst.sendall(data)
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)

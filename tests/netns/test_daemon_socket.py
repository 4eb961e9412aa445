"""The daemon's socket file across an overlap of two daemons (an upgrade that surges):
the old one stopping must not remove the socket the new one bound."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

from meta.daemon.metrics import Metrics
from meta.daemon.server import SocketServer
from meta.plugin import MetaPlugin


def _serving(socket_dir: Path) -> tuple[SocketServer, threading.Thread]:
    server = SocketServer(str(socket_dir), MetaPlugin(), Metrics(), 4)
    server.bind()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


def _stop(server: SocketServer, thread: threading.Thread) -> None:
    server.stop(grace=5)
    thread.join(5)
    assert not thread.is_alive()


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        try:
            client.connect(str(path))
        except OSError:
            return False
        return True


def test_a_stopping_daemon_removes_its_socket(tmp_path: Path) -> None:
    server, thread = _serving(tmp_path / "run")
    assert _answers(server.path)
    _stop(server, thread)
    assert not server.path.exists()


def test_a_stopping_daemon_leaves_the_socket_a_newer_one_bound(tmp_path: Path) -> None:
    old, old_thread = _serving(tmp_path / "run")
    new, new_thread = _serving(tmp_path / "run")
    try:
        _stop(old, old_thread)
        assert new.path.exists() and _answers(new.path)
    finally:
        _stop(new, new_thread)
    assert not new.path.exists()

"""`plexus daemon` run by tests inside a node namespace, started and stopped by PID."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from delegates.netns import run_in_netns
from meta.daemon import protocol
from tests.netns.conftest import Node

PLEXUS = str(Path(sys.executable).parent / "plexus")


class Daemon:
    """`plexus daemon` in the node's namespace, started and stopped by PID."""

    def __init__(self, node: Node, **extra: Any) -> None:
        self.node = node
        self.port = _free_port(node)
        self.config = node.root / "daemon.json"
        conf = node.meta(metricsPort=self.port, **extra)
        self.config.write_text(json.dumps(conf))
        self.socket = node.root / "run" / protocol.SOCKET_NAME
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [
            "ip",
            "netns",
            "exec",
            self.node.name,
            PLEXUS,
            "daemon",
            "--config",
            str(self.config),
            "--node-name",
            "test-node",
        ]

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 30
        while not self._ready():
            assert self.proc.poll() is None, "daemon exited at start-up"
            assert time.monotonic() < deadline, "daemon not ready after 30 s"
            time.sleep(0.05)

    def _ready(self) -> bool:
        try:
            return self.get("/readyz")[0] == 200
        except OSError:
            return False

    def get(self, path: str) -> tuple[int, str]:
        def fetch() -> tuple[int, str]:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=5) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as err:
                return err.code, err.read().decode()

        return run_in_netns(f"/run/netns/{self.node.name}", fetch)

    def metric(self, name: str, **labels: str) -> float:
        want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in self.get("/metrics")[1].splitlines():
            if line.startswith(f"{name}{{{want}}} ") or (
                not labels and line.startswith(f"{name} ")
            ):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=60)
            finally:
                if self.proc.poll() is None:  # stuck: do not leave it behind
                    self.proc.kill()
                    self.proc.wait()
        self.proc = None

    def threads(self) -> int:
        assert self.proc is not None
        return len(list(Path(f"/proc/{self.proc.pid}/task").iterdir()))

    def peak_rss_mib(self) -> float:
        assert self.proc is not None
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmHWM")


@contextmanager
def running(node: Node, **extra: Any) -> Iterator[Daemon]:
    """A started daemon; on exit, the test's ADDs are DELeted through it, then it stops."""
    daemon = Daemon(node, **extra)
    daemon.start()
    try:
        yield daemon
    finally:
        node.close()
        node.added.clear()
        daemon.stop()


def _free_port(node: Node) -> int:
    def pick() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    return run_in_netns(f"/run/netns/{node.name}", pick)

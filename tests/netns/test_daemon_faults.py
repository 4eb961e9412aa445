"""The daemon under faults: killed, abandoned by its shims, starved, stopped, squatted."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from delegates.netns import run_in_netns
from meta.daemon import protocol
from tests.netns.conftest import Node, finish
from tests.netns.daemon import Daemon, running
from tests.wait import wait_for

NOBODY = 65534
STRAY_LEASE = "10.97.0.9"


class Gate:
    """NAD gated-net: macvlan chained with `gated`, a plugin that records its pid on ADD
    and waits for the test to open the gate; then it attaches a link (late0) and a
    lease of its own that nothing records."""

    def __init__(self, node: Node) -> None:
        self.pidfile = node.root / "gated.pid"
        self.gate = node.root / "gate"
        plugin = node.bin / "gated"
        plugin.write_text(
            "#!/bin/sh\n"
            '[ "$CNI_COMMAND" = ADD ] || exit 0\n'
            f"echo $$ > {self.pidfile}\n"
            f"while [ ! -e {self.gate} ]; do sleep 0.05; done\n"
            'nsenter --net="$CNI_NETNS" ip link add late0 type veth peer name late1\n'
            f"mkdir -p {node.ipam}/late && touch {node.ipam}/late/{STRAY_LEASE}\n"
            f"exec {sys.executable} -c "
            "'import json,sys; print(json.dumps(json.load(sys.stdin)[\"prevResult\"]))'\n"
        )
        plugin.chmod(0o755)
        node.nad(
            "gated-net",
            {
                "cniVersion": "1.0.0",
                "name": "gated-net",
                "plugins": [node.macvlan_conf(), {"type": "gated"}],
            },
        )

    def pid(self) -> int:
        """The pid of the gated plugin once it waits at the gate."""
        wait_for(lambda: self.pidfile.exists() and self.pidfile.read_text().strip(), "the gate")
        return int(self.pidfile.read_text())

    def open(self) -> None:
        self.gate.touch()

    def kill(self) -> None:
        """End a gated plugin still waiting (one that outlived what should have ended it)."""
        if self.pidfile.exists() and not _gone(pid := int(self.pidfile.read_text())):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def gate(node: Node) -> Iterator[Gate]:
    g = Gate(node)
    try:
        yield g
    finally:
        g.kill()


def _gone(pid: int) -> bool:
    """Exited: reaped, or a zombie nobody reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_killed_daemon_takes_its_delegates_along(node: Node, gate: Gate) -> None:
    node.pod("k", "gated-net")
    netns = node.pod_netns()
    with running(node) as daemon:
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(node.cni, "ADD", netns=netns, cid="c-k", pod="k")
            plugin = gate.pid()
            daemon.stop(signal.SIGKILL)
            answer = pending.result(timeout=60)
        assert json.loads(answer.stdout)["code"] == 11
        wait_for(lambda: _gone(plugin), "the delegate to end with the daemon", timeout=10)
        gate.open()  # had it survived, it would attach late0 and its lease now

        daemon.start()
        node.ok("DEL", netns=netns, cid="c-k", pod="k")
        assert node.links(netns) == ["lo"]
        assert node.reserved_ips() == []


def _gated_and_plain(node: Node) -> tuple[str, str]:
    """Pod a on gated-net and pod b on a plain macvlan network: their netns."""
    node.pod("a", "gated-net")
    gated = node.pod_netns()
    node.nad("macvlan-net", node.macvlan_conf())
    node.pod("b", "macvlan-net")
    return gated, node.pod_netns()


def test_a_killed_shim_cancels_its_call_and_frees_the_worker(node: Node, gate: Gate) -> None:
    netns, other = _gated_and_plain(node)
    with running(node, maxConcurrentRequests=1):
        shim = node.spawn("ADD", netns=netns, cid="c-a", pod="a")
        plugin = gate.pid()
        shim.kill()  # what a runtime does when its CNI timeout expires
        shim.communicate()
        wait_for(lambda: _gone(plugin), "the delegate to end with its call", timeout=10)
        wait_for(lambda: node.links(netns) == ["lo"], "the rollback to remove net1")
        # ...and released net1's IP: once the only worker slot is free, this one is served.
        node.ok("ADD", netns=other, cid="c-b", pod="b")
        assert len(node.reserved_ips()) == 2  # b's eth0 and net1: nothing of a


def test_a_hung_delegate_times_out_and_the_add_rolls_back(node: Node, gate: Gate) -> None:
    node.pod("h", "gated-net")
    netns = node.pod_netns()
    with running(node, delegateTimeoutSeconds=1):
        error = node.error(
            "ADD", netns=netns, cid="c-h", pod="h", conf=node.meta(delegateTimeoutSeconds=1)
        )
        assert "plugin gated timed out after 1 s and was killed" in error["msg"]
        assert _gone(gate.pid())
        assert node.links(netns) == ["lo"] and node.reserved_ips() == []


def _trickle(sock: socket.socket, frame: bytes) -> tuple[int, dict[str, Any]]:
    """Send `frame` a byte every half second until the daemon answers (for 30 s at most,
    twice the daemon's deadline for a whole request); its answer."""
    for byte in frame[:60]:
        if select.select([sock], [], [], 0.5)[0]:
            break
        sock.send(bytes([byte]))
    return _answer(sock)


def _answer(sock: socket.socket) -> tuple[int, dict[str, Any]]:
    sock.settimeout(60)
    code, out = protocol.read_response(sock)
    return code, json.loads(out)


def test_idle_and_trickling_clients_do_not_starve_the_workers(node: Node) -> None:
    node.nad("macvlan-net", node.macvlan_conf())
    node.pod("r", "macvlan-net")
    netns = node.pod_netns()
    frame = protocol.encode_request({"CNI_COMMAND": "VERSION"}, json.dumps(node.meta()).encode())
    with running(node, maxConcurrentRequests=2) as daemon:
        clients = [socket.socket(socket.AF_UNIX) for _ in range(4)]
        try:
            for client in clients:
                client.connect(str(daemon.socket))
            with ThreadPoolExecutor(2) as pool:
                trickled = [pool.submit(_trickle, c, frame) for c in clients[2:]]
                node.ok("ADD", netns=netns, cid="c-r", pod="r")  # served meanwhile
                answers = [t.result(timeout=120) for t in trickled]
            answers += [_answer(client) for client in clients[:2]]
        finally:
            for client in clients:
                client.close()
    for code, error in answers:
        assert code == 1 and "did not arrive whole within 10 s" in error["details"]


def _raw_add(node: Node, netns: str, cid: str, pod: str) -> socket.socket:
    """An ADD sent on the socket the way the shim sends it; read the answer later."""
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": netns,
        "CNI_IFNAME": "eth0",
        "CNI_PATH": str(node.bin),
        "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};"
        f"K8S_POD_UID=uid-{pod}",
    }
    node.added.append({"netns": netns, "cid": cid, "pod": pod})
    sock = socket.socket(socket.AF_UNIX)
    sock.connect(str(node.root / "run" / protocol.SOCKET_NAME))
    sock.sendall(protocol.encode_request(env, json.dumps(node.meta()).encode()))
    sock.shutdown(socket.SHUT_WR)
    return sock


def test_sigterm_serves_the_calls_queued_behind_the_busy_workers(node: Node, gate: Gate) -> None:
    first_ns, queued_ns = _gated_and_plain(node)
    with running(node, maxConcurrentRequests=1) as daemon, ThreadPoolExecutor(1) as pool:
        first = pool.submit(node.cni, "ADD", netns=first_ns, cid="c-a", pod="a")
        gate.pid()
        with _raw_add(node, queued_ns, "c-b", "b") as queued:
            wait_for(lambda: daemon.metric("plexus_requests_queued") == 1, "a queued request")
            assert daemon.proc is not None
            daemon.proc.send_signal(signal.SIGTERM)
            gate.open()
            code, out = _answer(queued)
        assert code == 0, out
        assert first.result(timeout=60).returncode == 0
        assert daemon.proc.wait(timeout=60) == 0
        assert len(node.network_status("b")) == 2
        daemon.start()  # for the DELs on the way out


def test_the_daemon_takes_over_a_socket_dir_of_another_user(node: Node) -> None:
    run = node.root / "run"
    run.mkdir()
    os.chown(run, NOBODY, NOBODY)
    run.chmod(0o777)
    with running(node):
        st = run.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, 0, 0o700)


@pytest.mark.parametrize(
    ("layout", "words"),
    [
        ("symlink", "is not a directory (a symlink is refused)"),
        ("shared", "holds other files (notes.txt): it must be a directory of its own"),
    ],
)
def test_the_daemon_refuses_a_socket_dir_it_must_not_take_over(
    node: Node, layout: str, words: str
) -> None:
    run, elsewhere = node.root / "run", node.root / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    if layout == "symlink":
        run.symlink_to(elsewhere)
    else:
        run.mkdir(mode=0o755)
        (run / "notes.txt").write_text("not the daemon's\n")
    proc = subprocess.Popen(Daemon(node).command(), stderr=subprocess.PIPE, text=True)
    _, stderr = finish(proc)
    assert proc.returncode != 0
    assert f"socketDir {run} {words}" in stderr
    assert list(elsewhere.iterdir()) == []
    assert run.lstat().st_mode & 0o777 == (0o777 if layout == "symlink" else 0o755)


@pytest.mark.parametrize("squatted", ["directory", "socket"])
def test_the_shim_refuses_a_socket_another_user_could_have_put_there(
    node: Node, squatted: str
) -> None:
    run = node.root / "run"
    run.mkdir(mode=0o700)
    path = run / protocol.SOCKET_NAME
    impostor = socket.socket(socket.AF_UNIX)
    impostor.bind(str(path))
    impostor.listen()
    os.chown(run if squatted == "directory" else path, NOBODY, NOBODY)

    def answer() -> None:
        # What a squatter would do: say yes to everything. The shim should never
        # connect, so the accept ends when the socket is shut down below.
        with contextlib.suppress(OSError), impostor.accept()[0] as conn:
            conn.sendall(protocol.encode_response(0, b'{"cniVersion":"1.0.0"}'))

    squatter = threading.Thread(target=answer, daemon=True)
    squatter.start()
    try:
        error = node.error("DEL", cid="c-s")
    finally:
        impostor.shutdown(socket.SHUT_RDWR)
        squatter.join(10)
        impostor.close()
    assert not squatter.is_alive()
    assert error["code"] == 5
    assert f"refusing {run if squatted == 'directory' else path}" in error["msg"]


def test_idle_http_connections_pin_no_threads_and_healthz_answers(node: Node) -> None:
    with running(node) as daemon:
        before = daemon.threads()
        address = ("127.0.0.1", daemon.port)
        idle = run_in_netns(
            f"/run/netns/{node.name}",
            lambda: [socket.create_connection(address) for _ in range(100)],
        )
        try:
            assert daemon.get("/healthz") == (200, "ok\n")
            assert daemon.threads() < before + 10
            for conn in idle:  # the server drops each at its request deadline
                conn.settimeout(60)
                assert conn.recv(1) == b""
        finally:
            for conn in idle:
                conn.close()

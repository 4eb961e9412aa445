"""The compiled shim without plexus-thin beside it: waits for the daemon, then says it is down."""

from __future__ import annotations

import signal
from pathlib import Path

from meta.daemon import protocol
from tests.netns.conftest import Node
from tests.netns.daemon import running
from tests.wait import wait_for


def _waiting_in_the_shim(pid: int) -> bool:
    """True once the shim sleeps between connection attempts."""
    try:
        return "nanosleep" in Path(f"/proc/{pid}/wchan").read_text()
    except FileNotFoundError:
        return False


def test_without_thin_the_shim_waits_for_a_restarting_daemon(node: Node) -> None:
    (node.bin / "plexus-thin").unlink()
    node.nad("macvlan-net", node.macvlan_conf())
    node.pod("w", "macvlan-net")
    netns = node.pod_netns()
    with running(node, daemonWaitSeconds=120) as daemon:
        daemon.stop(signal.SIGKILL)  # its socket stays behind, refusing connections
        shim = node.spawn(
            "ADD", netns=netns, cid="c-w", pod="w", conf=node.meta(daemonWaitSeconds=120)
        )
        wait_for(
            lambda: shim.poll() is not None or _waiting_in_the_shim(shim.pid), "the shim to wait"
        )
        assert shim.poll() is None, f"the shim gave up: {shim.communicate()}"
        daemon.start()
        stdout, _ = shim.communicate(timeout=120)
        assert shim.returncode == 0, stdout
        assert node.links(netns) == ["eth0", "lo", "net1"]


def test_without_thin_or_daemon_the_shim_says_the_daemon_is_down(node: Node) -> None:
    (node.bin / "plexus-thin").unlink()
    error = node.error("DEL", cid="c-d", conf=node.meta(daemonWaitSeconds=0.5))
    assert error["code"] == 11
    socket_path = node.root / "run" / protocol.SOCKET_NAME
    assert error["msg"] == f"plexus shim: the Plexus daemon is not running at {socket_path}"
    assert "waited 0.5 s" in error["details"]

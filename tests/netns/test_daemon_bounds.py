"""The daemon's bounds on what a network's plugins and IPAM state can make it do: a
plugin's output is read up to a bound, an in-process delegate has the deadline of an
exec'd one, and in-process host-local reads only its own network's regular files."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.netns.conftest import Node
from tests.netns.daemon import Daemon, running
from tests.wait import wait_for

TIMEOUT = 3  # delegateTimeoutSeconds for the calls that must hit it
KMSG = os.makedev(1, 11)
"""/dev/kmsg: reading one to its end blocks for the next kernel message."""


def _add(node: Node, pod: str, networks: str, **meta: object) -> dict[str, object]:
    """ADD pod `pod` (container c-<pod>) on `networks` through the daemon; its answer."""
    node.pod(pod, networks)
    done = node.cni("ADD", netns=node.pod_netns(), cid=f"c-{pod}", pod=pod, conf=node.meta(**meta))
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


def test_a_plugin_printing_hundreds_of_mib_fails_and_the_daemon_stays_small(node: Node) -> None:
    """Output past 8 MiB kills the plugin and fails the call at once (not at the
    timeout), and the daemon never holds it: its peak RSS grows by far less."""
    flood = node.bin / "flood"
    flood.write_text("#!/bin/sh\nhead -c 300M /dev/zero\nexec sleep 60\n")
    flood.chmod(0o755)
    node.nad("flood-net", {"cniVersion": "1.0.0", "name": "flood-net", "type": "flood"})
    node.nad("macvlan-net", node.macvlan_conf(name="macvlan-net"))
    with running(node, delegateTimeoutSeconds=20) as daemon:
        assert "ips" in _add(node, "warm", "macvlan-net", delegateTimeoutSeconds=20)
        before = daemon.peak_rss_mib()
        started = time.monotonic()
        error = _add(node, "f", "flood-net", delegateTimeoutSeconds=20)
        took = time.monotonic() - started
        after = daemon.peak_rss_mib()
        assert error["code"] == 5, error
        assert "plugin flood printed more than 8 MiB on stdout and was killed" in str(error["msg"])
        assert took < 15, f"{took:.1f} s: the call waited for the plugin"
        assert after - before < 48, f"peak RSS {before:.0f} -> {after:.0f} MiB"
        assert "ips" in _add(node, "after", "macvlan-net", delegateTimeoutSeconds=20)


@contextmanager
def _held(lock: Path) -> Iterator[None]:
    """Hold host-local's lock on a network, as a reference host-local that hangs would."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDONLY | os.O_CREAT, 0o750)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _leases(directory: Path) -> dict[str, str]:
    """IP -> holder of the leases in a network's dir."""
    if not directory.is_dir():
        return {}
    return {
        p.name: p.read_bytes().decode()
        for p in directory.iterdir()
        if p.name[0].isdigit() and p.is_file() and not p.is_symlink()
    }


def test_an_in_process_delegate_stuck_past_its_deadline_fails_and_the_daemon_serves_on(
    node: Node,
) -> None:
    """The in-process macvlan waits on its IPAM's lock, held elsewhere: the ADD fails at
    the deadline with code 5 naming it, other pods are served meanwhile, and the stuck
    work, once it ends, is undone by the runtime's DEL (it held its attachment)."""
    node.nad("stuck-net", node.macvlan_conf(name="stuck-net"))
    node.nad("free-net", node.macvlan_conf("10.97.0.0/16", name="free-net"))
    stuck = node.ipam / "stuck-net"
    with running(node, delegateTimeoutSeconds=TIMEOUT):
        with _held(stuck / "lock"):
            started = time.monotonic()
            node.pod("s", "stuck-net")
            netns = node.pod_netns()
            error = node.error(
                "ADD",
                netns=netns,
                cid="c-s",
                pod="s",
                conf=node.meta(delegateTimeoutSeconds=TIMEOUT),
            )
            took = time.monotonic() - started
            assert error["code"] == 5, error
            assert f"plugin macvlan timed out after {TIMEOUT} s (in-process" in error["msg"]
            assert took < 6 * TIMEOUT, f"{took:.1f} s"  # the ADD, then its rollback's DEL
            assert "ips" in _add(node, "t", "free-net", delegateTimeoutSeconds=TIMEOUT)
        # The stuck ADD goes on now: it reserves its address, its result dropped...
        wait_for(lambda: "c-s\r\nnet1" in _leases(stuck).values(), "the stuck ADD's lease")
        node.ok(
            "DEL", netns=netns, cid="c-s", pod="s", conf=node.meta(delegateTimeoutSeconds=TIMEOUT)
        )
        # ...and the runtime's DEL, which waited for it, undid all of it.
        assert node.links(netns) == ["lo"]
        assert "c-s\r\nnet1" not in _leases(stuck).values()
    log = (node.root / "plexus.log").read_text()
    assert "Traceback" not in log


@pytest.fixture
def traps(node: Node) -> Iterator[dict[str, Path]]:
    """A NAD whose host-local network dir holds, under address names, a FIFO, a device
    node and a symlink to a file outside holding a lease's key."""
    directory = node.root / "traps" / "trap-net"
    directory.mkdir(parents=True)
    outside = node.root / "outside"
    outside.write_bytes(b"c-x\r\nnet1")
    paths = {
        "fifo": directory / "10.96.0.20",
        "device": directory / "10.96.0.21",
        "symlink": directory / "10.96.0.22",
        "outside": outside,
        "dir": directory,
    }
    os.mkfifo(paths["fifo"])
    os.mknod(paths["device"], 0o600 | stat.S_IFCHR, KMSG)
    paths["symlink"].symlink_to(outside)
    conf = node.macvlan_conf("10.96.0.0/16", name="trap-net")
    conf["ipam"]["dataDir"] = str(node.root / "traps")
    node.nad("trap-net", conf)
    try:
        yield paths
    finally:
        _free_fifo_readers(paths["fifo"])


def _free_fifo_readers(fifo: Path) -> None:
    """A reader blocked opening the FIFO (had one been opened) gets its EOF."""
    with contextlib.suppress(OSError):  # nobody reading
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


def test_host_local_never_opens_fifos_devices_or_symlinks_in_its_data_dir(
    node: Node, traps: dict[str, Path]
) -> None:
    with running(node, delegateTimeoutSeconds=10) as daemon, _unstuck(daemon, traps):
        started = time.monotonic()
        result = _add(node, "x", "trap-net", delegateTimeoutSeconds=10)
        assert "ips" in result, result
        gc = node.meta(
            delegateTimeoutSeconds=10,
            **{"cni.dev/valid-attachments": [{"containerID": "c-x", "ifname": "eth0"}]},
        )
        node.ok("GC", conf=gc)
        assert time.monotonic() - started < 20
        left = sorted(p.name for p in traps["dir"].iterdir())
        assert left == [
            "10.96.0.2",  # the pod's own lease
            "10.96.0.20",
            "10.96.0.21",
            "10.96.0.22",
            "last_reserved_ip.0",
            "lock",
        ]
        assert traps["outside"].read_bytes() == b"c-x\r\nnet1"


@contextmanager
def _unstuck(daemon: Daemon, traps: dict[str, Path]) -> Iterator[None]:
    """On a failure (a call stuck in a trap), kill the daemon and take the traps away,
    so that the DELs of the teardown do not get stuck in them too."""
    try:
        yield
    except BaseException:
        daemon.stop(signal.SIGKILL)
        for trap in traps.values():
            if trap.is_symlink() or not (trap.is_dir() or trap.is_file()):
                _free_fifo_readers(trap)
                trap.unlink()
        raise


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
def test_host_local_refuses_a_lock_file_that_is_not_a_regular_file(node: Node, kind: str) -> None:
    directory = node.root / "traps" / "trap-net"
    directory.mkdir(parents=True)
    victim = node.root / "victim"
    victim.write_text("precious")
    if kind == "symlink":
        (directory / "lock").symlink_to(victim)
    else:
        os.mkfifo(directory / "lock")
    conf = node.macvlan_conf("10.96.0.0/16", name="trap-net")
    conf["ipam"]["dataDir"] = str(node.root / "traps")
    node.nad("trap-net", conf)
    with (
        running(node, delegateTimeoutSeconds=10) as daemon,
        _unstuck(daemon, {"lock": directory / "lock"}),
    ):
        error = _add(node, "x", "trap-net", delegateTimeoutSeconds=10)
    assert error["code"] == 5, error
    assert f"host-local: cannot open the lock file {directory}/lock" in str(error["msg"])
    assert victim.read_text() == "precious"


def test_gc_of_a_network_does_not_see_a_network_nested_in_its_dir(node: Node) -> None:
    """outer-net keeps its leases in <D>/outer-net, inner-net in <D>/outer-net/inner-net:
    outer-net's GC, whose valid attachments are its own, used to walk into inner-net and
    release its leases."""
    data = node.root / "nested"
    outer = node.macvlan_conf("10.95.0.0/16", name="outer-net", cniVersion="1.1.0")  # has GC
    outer["ipam"]["dataDir"] = str(data)
    inner = node.macvlan_conf("10.94.0.0/16", name="inner-net", cniVersion="1.1.0")
    inner["ipam"]["dataDir"] = str(data / "outer-net")
    node.nad("outer-net", outer)
    node.nad("inner-net", inner)
    with running(node):
        assert "ips" in _add(node, "i", "inner-net")
        assert "ips" in _add(node, "o", "outer-net")
        valid = [{"containerID": f"c-{p}", "ifname": "eth0"} for p in ("i", "o")]
        node.ok("GC", conf=node.meta(**{"cni.dev/valid-attachments": valid}))
        assert list(_leases(data / "outer-net" / "inner-net").values()) == ["c-i\r\nnet1"]
        assert list(_leases(data / "outer-net").values()) == ["c-o\r\nnet1"]

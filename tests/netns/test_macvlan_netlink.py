"""The netlink helpers under the macvlan/ipvlan path (delegates.link on delegates.rtnl),
against the kernel in throwaway namespaces; checked with iproute2 where it matters. Also
the in-process plugin as a whole where the kernel is needed: no descriptor leaks across
many calls, and `execDelegates` routing its IPAM to the reference binary."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from ipaddress import ip_address, ip_interface, ip_network
from pathlib import Path
from typing import Any, TypeVar

import pytest

from cni.env import cni_env
from cni.errors import CNIError
from cni.result import IPInterface
from delegates import link
from delegates.builtin import BuiltinExecutor
from delegates.netns import run_in_netns
from delegates.rtnl import Rtnl

T = TypeVar("T")
REFERENCE = Path("/usr/lib/cni")

if os.geteuid() != 0:
    pytest.skip("needs root to create network namespaces", allow_module_level=True)


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], check=True, capture_output=True, text=True).stdout


@dataclass
class Pair:
    """A host namespace with an up veth `up0` (the master) and an empty pod namespace."""

    host: str
    pod: str

    def in_host(self, fn: Callable[[Rtnl], T]) -> T:
        return run_in_netns(f"/run/netns/{self.host}", lambda: _with(fn))

    def in_pod(self, fn: Callable[[Rtnl], T]) -> T:
        return run_in_netns(f"/run/netns/{self.pod}", lambda: _with(fn))

    def macvlan(self, name: str = "plxtest", **kw: object) -> None:
        """A bridge-mode macvlan on up0, created straight into the pod."""

        def create(nl: Rtnl) -> None:
            master = link.find_link(nl, "up0")
            assert master is not None
            with link.netns_fd(f"/run/netns/{self.pod}") as fd:
                link.create_child(nl, "macvlan", name, master.index, 4, netns=fd, **kw)  # type: ignore[arg-type]

        self.in_host(create)


def _with(fn: Callable[[Rtnl], T]) -> T:
    with link.netlink() as nl:
        return fn(nl)


@pytest.fixture
def pair() -> Iterator[Pair]:
    tag = uuid.uuid4().hex[:6]
    p = Pair(f"pxnl-h-{tag}", f"pxnl-p-{tag}")
    try:
        for ns in (p.host, p.pod):
            ip("netns", "add", ns)
        ip("-n", p.host, "link", "add", "up0", "type", "veth", "peer", "name", "up1")
        ip("-n", p.host, "link", "set", "up0", "up")
        ip("-n", p.host, "link", "set", "up1", "up")
        yield p
    finally:
        for ns in (p.host, p.pod):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_macvlan_created_in_the_pod_with_its_attributes(pair: Pair) -> None:
    pair.macvlan(mtu=1400, mac="02:11:22:33:44:55")
    got = pair.in_pod(lambda nl: link.find_link(nl, "plxtest"))
    assert got is not None
    assert (got.kind, got.mode, got.mtu, got.mac) == ("macvlan", 4, 1400, "02:11:22:33:44:55")
    assert pair.in_host(lambda nl: link.find_link(nl, "plxtest")) is None
    assert "macvlan mode bridge" in ip("-n", pair.pod, "-d", "link", "show", "plxtest")


def test_macvlan_bcqueuelen(pair: Pair) -> None:
    pair.macvlan(bcqueuelen=4321)
    pair.macvlan("plxdflt")
    data = {
        name: json.loads(ip("-n", pair.pod, "-d", "-j", "link", "show", name))[0]["linkinfo"][
            "info_data"
        ]
        for name in ("plxtest", "plxdflt")
    }
    assert data["plxtest"]["bcqueuelen"] == 4321
    assert data["plxdflt"]["bcqueuelen"] == 1000  # not sent: the kernel's default
    assert data["plxdflt"]["usedbcqueuelen"] == 4321  # the port uses the largest request


def test_rename_and_up_then_delete(pair: Pair) -> None:
    pair.macvlan()

    def rename(nl: Rtnl) -> link.Link | None:
        tmp = link.find_link(nl, "plxtest")
        assert tmp is not None
        link.set_link(nl, tmp.index, name="net1", up=True)
        return link.find_link(nl, index=tmp.index)

    got = pair.in_pod(rename)
    assert got is not None and got.name == "net1" and got.flags & link.IFF_UP
    assert pair.in_pod(lambda nl: link.delete_link(nl, "net1"))
    assert not pair.in_pod(lambda nl: link.delete_link(nl, "net1"))
    assert not pair.in_pod(lambda nl: link.delete_link(nl, index=got.index))


def test_missing_links_and_kernel_errors(pair: Pair) -> None:
    assert pair.in_pod(lambda nl: link.find_link(nl, "nosuch")) is None
    assert pair.in_pod(lambda nl: link.find_link(nl, index=4242)) is None
    pair.macvlan()
    with pytest.raises(OSError) as info:
        pair.macvlan()
    assert info.value.errno == errno.EEXIST
    assert link.describe(info.value) == "file exists"


def test_link_index_finds_what_getlink_by_name_finds(pair: Pair) -> None:
    ip("-n", pair.host, "link", "property", "add", "dev", "up0", "altname", "plxalt0")

    def both(nl: Rtnl, name: str) -> tuple[int | None, int | None]:
        found = link.find_link(nl, name)
        return link.link_index(name), found.index if found is not None else None

    for name in ("up0", "plxalt0", "nosuch"):
        index, want = pair.in_host(lambda nl, name=name: both(nl, name))  # type: ignore[misc]
        assert index == want and (index is None) == (name == "nosuch"), name
    # names no link can have (too long, a NUL byte); the calling thread's namespace only
    assert pair.in_host(lambda nl: [link.link_index(n) for n in ("x" * 16, "up0\0")]) == [None] * 2
    assert pair.in_pod(lambda nl: link.link_index("up0")) is None


def test_addresses_and_routes(pair: Pair) -> None:
    pair.macvlan()

    def configure(nl: Rtnl) -> tuple[list[tuple[IPInterface, int]], list[link.RouteEntry]]:
        dev = link.find_link(nl, "plxtest")
        assert dev is not None
        link.set_link(nl, dev.index, up=True)
        link.add_address(nl, dev.index, ip_interface("10.1.2.3/24"))
        link.add_address(nl, dev.index, ip_interface("fd00::3/64"))
        with pytest.raises(OSError) as info:
            link.add_address(nl, dev.index, ip_interface("10.1.2.3/24"))
        assert info.value.errno == errno.EEXIST
        gw = ip_address("10.1.2.1")
        link.add_route(nl, dev.index, ip_network("0.0.0.0/0"), gw)
        link.add_route(
            nl, dev.index, ip_network("10.9.0.0/16"), gw, mtu=1300, advmss=1200, priority=7
        )
        link.add_route(nl, dev.index, ip_network("10.8.0.0/16"), None, table=1000)
        link.add_route(nl, dev.index, ip_network("fd01::/64"), None)
        assert link.default_route_link(nl) == "plxtest"
        found = [(a, f) for a, f in link.addresses(nl, dev.index)]
        return found, link.routes(nl, socket.AF_INET) + link.routes(nl, socket.AF_INET6, 1000)

    addrs, routes = pair.in_pod(configure)
    assert {str(a) for a, _ in addrs} >= {"10.1.2.3/24", "fd00::3/64"}
    dev = pair.in_pod(lambda nl: link.find_link(nl, "plxtest"))
    assert dev is not None
    gw = ip_address("10.1.2.1")
    assert link.RouteEntry(ip_network("10.9.0.0/16"), gw, dev.index) in routes
    assert link.RouteEntry(ip_network("0.0.0.0/0"), gw, dev.index) in routes
    assert link.RouteEntry(ip_network("10.8.0.0/16"), None, dev.index) not in routes  # table 1000
    shown = ip("-n", pair.pod, "route", "show", "10.9.0.0/16")
    assert all(w in shown for w in ("metric 7", "mtu 1300", "advmss 1200")), shown
    assert "brd 10.1.2.255" in ip("-n", pair.pod, "addr", "show", "plxtest")
    assert "10.8.0.0/16" in ip("-n", pair.pod, "route", "show", "table", "1000")
    assert "fd01::/64" in ip("-n", pair.pod, "-6", "route", "show")


def test_multipath_routes_give_one_entry_per_hop(pair: Pair) -> None:
    ip("-n", pair.host, "addr", "add", "10.5.0.1/24", "dev", "up0")
    ip("-n", pair.host, "addr", "add", "10.6.0.1/24", "dev", "up1")
    ip(
        "-n", pair.host, "route", "add", "10.7.0.0/16",
        "nexthop", "via", "10.5.0.2", "dev", "up0",
        "nexthop", "via", "10.6.0.2", "dev", "up1",
    )  # fmt: skip
    got = pair.in_host(lambda nl: link.routes(nl, socket.AF_INET))
    hops = {(str(r.gw), r.oif) for r in got if r.dst == ip_network("10.7.0.0/16")}
    up0, up1 = (pair.in_host(partial(link.find_link, name=n)) for n in ("up0", "up1"))
    assert up0 is not None and up1 is not None
    assert hops == {("10.5.0.2", up0.index), ("10.6.0.2", up1.index)}


# -- the in-process plugin ------------------------------------------------------------------


def _conf(data_dir: Path, master: str = "up0", ipam: str = "host-local") -> bytes:
    return json.dumps(
        {
            "cniVersion": "1.0.0",
            "name": "fdnet",
            "type": "macvlan",
            "master": master,
            "ipam": {
                "type": ipam,
                "dataDir": str(data_dir),
                "ranges": [[{"subnet": "10.66.0.0/24", "gateway": "10.66.0.1"}]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        }
    ).encode()


def _call(
    pair: Pair,
    executor: BuiltinExecutor,
    verb: str,
    stdin: bytes,
    netns: str,
    cid: str,
    path: str = str(REFERENCE),
) -> bytes:
    """One call of the in-process macvlan, from inside the host namespace."""
    env = cni_env(verb, cid, netns, "eth0", (), [path])
    return run_in_netns(f"/run/netns/{pair.host}", partial(executor.run, "macvlan", stdin, env))


def _with_prev(stdin: bytes, prev: bytes) -> bytes:
    return json.dumps({**json.loads(stdin), "prevResult": json.loads(prev)}).encode()


def _open_fds() -> list[str]:
    """The process's descriptors, but its TCP connections: those are the session's, not the
    delegates' (the cluster tier's nodes keep running, relayed to the API server through
    this process, tests/cluster/forward.py); a descriptor closed while listed is left out."""
    kept = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith("socket:"):
                with socket.socket(fileno=os.dup(int(fd))) as sock:
                    if sock.family in (socket.AF_INET, socket.AF_INET6):
                        continue
        except OSError:
            continue
        kept.append(fd)
    return sorted(kept)


def test_no_descriptor_leaks_over_many_calls(pair: Pair, tmp_path: Path) -> None:
    """50 rounds of in-process ADD/CHECK/DEL, a failing ADD (no such master) and a DEL after
    the pod namespace is gone: the process holds exactly the descriptors it held before."""
    executor = BuiltinExecutor()
    good, bad = _conf(tmp_path / "ipam"), _conf(tmp_path / "ipam", master="nope0")
    pod = f"/run/netns/{pair.pod}"

    def round_trip(i: int) -> None:
        prev = _call(pair, executor, "ADD", good, pod, f"c{i}")
        _call(pair, executor, "CHECK", _with_prev(good, prev), pod, f"c{i}")
        _call(pair, executor, "DEL", good, pod, f"c{i}")
        with pytest.raises(CNIError) as info:
            _call(pair, executor, "ADD", bad, pod, f"bad{i}")
        assert "nope0" in info.value.msg
        gone = f"{pair.pod}-g"
        ip("netns", "add", gone)
        try:
            _call(pair, executor, "ADD", good, f"/run/netns/{gone}", f"g{i}")
        finally:
            ip("netns", "del", gone)
        _call(pair, executor, "DEL", good, f"/run/netns/{gone}", f"g{i}")

    round_trip(-1)  # imports, caches and the like are allowed once
    before = _open_fds()
    for i in range(50):
        round_trip(i)
    assert _open_fds() == before
    assert ip("-n", pair.pod, "-br", "link").split()[0] == "lo"
    assert sorted(p.name for p in (tmp_path / "ipam" / "fdnet").iterdir()) == [
        "last_reserved_ip.0",
        "lock",
    ]


def test_exec_delegates_runs_ipam_from_cni_path(pair: Pair, tmp_path: Path) -> None:
    """execDelegates ["host-local"]: the in-process macvlan execs the reference host-local
    binary for its IPAM, with the same result, addresses and leases as all in-process."""
    if not os.access(REFERENCE / "host-local", os.X_OK):
        pytest.skip("needs the reference host-local")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "host-local.log"
    wrapper = bin_dir / "host-local"
    wrapper.write_text(
        f'#!/bin/sh\necho "$CNI_COMMAND" >> {log}\nexec {REFERENCE / "host-local"}\n'
    )
    wrapper.chmod(0o755)
    pods = {"inproc": f"/run/netns/{pair.pod}", "exec": f"/run/netns/{pair.pod}-x"}
    ip("netns", "add", os.path.basename(pods["exec"]))
    try:
        out: dict[str, Any] = {}
        for flavor, types in (("inproc", set()), ("exec", {"host-local"})):
            executor = BuiltinExecutor(exec_types=types)
            conf = _conf(tmp_path / flavor)
            pod = pods[flavor]
            raw = _call(pair, executor, "ADD", conf, pod, "c1", str(bin_dir))
            result = json.loads(raw)
            for iface in result["interfaces"]:
                iface["mac"], iface["sandbox"] = "<mac>", "<pod>"
            addrs = ip("-n", os.path.basename(pod), "-4", "-br", "addr", "show", "eth0").split()
            leases = sorted(p.name for p in (tmp_path / flavor / "fdnet").iterdir())
            out[flavor] = (result, addrs[2:], leases)
            _call(pair, executor, "CHECK", _with_prev(conf, raw), pod, "c1", str(bin_dir))
            _call(pair, executor, "DEL", conf, pod, "c1", str(bin_dir))
            assert not any(
                p.name.startswith("10.") for p in (tmp_path / flavor / "fdnet").iterdir()
            )
            if flavor == "inproc":
                assert not log.exists()
        assert out["exec"] == out["inproc"]
        assert out["exec"][1] == ["10.66.0.2/24"]
        assert log.read_text().split() == ["ADD", "CHECK", "DEL"]
    finally:
        subprocess.run(["ip", "netns", "del", os.path.basename(pods["exec"])], capture_output=True)

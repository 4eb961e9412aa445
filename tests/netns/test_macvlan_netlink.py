"""The netlink helpers under the macvlan/ipvlan path (delegates.link on delegates.rtnl),
against the kernel in throwaway namespaces; checked with iproute2 where it matters."""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from ipaddress import ip_address, ip_interface, ip_network
from typing import TypeVar

import pytest

from cni.result import IPInterface
from delegates import link
from delegates.netns import run_in_netns
from delegates.rtnl import Rtnl

T = TypeVar("T")

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

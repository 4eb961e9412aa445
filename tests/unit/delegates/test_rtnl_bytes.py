"""Every request delegates.link and delegates.vf send, byte for byte as the struct-built
encoder before pyroute2 sent them (main at df6465a, whose ipvlan, VLAN and SR-IOV VF tests
passed on the VM tier): rtnl_requests.json holds (type, body hex, flags; -1 for a dump)."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
from collections.abc import Callable
from ipaddress import ip_address, ip_interface, ip_network
from pathlib import Path

import pytest

from cni.errors import CNIError
from delegates import link, rtnl, vf
from delegates.rtnl import RTM_GETLINK, RTM_GETROUTE, RTM_NEWLINK, RTM_NEWROUTE, Rtnl

EXPECTED = json.loads((Path(__file__).parent / "rtnl_requests.json").read_text())


def _route(family: int, table: int, oif: int, gw: bytes | None, priority: int) -> bytes:
    """A route as a dump reply carries it (header, RTA_TABLE, RTA_OIF, [gateway, priority])."""

    def attr(kind: int, payload: bytes) -> bytes:
        return struct.pack("=HH", 4 + len(payload), kind) + payload + b"\0" * (-len(payload) % 4)

    body = struct.pack("=BBBBBBBBI", family, 0, 0, 0, table & 0xFF, 3, 0, 1, 0)
    body += attr(15, struct.pack("=I", table)) + attr(4, struct.pack("=I", oif))
    if gw:
        body += attr(5, gw)
    if priority:
        body += attr(6, struct.pack("=I", priority))
    return struct.pack("=IHHII", 16 + len(body), RTM_NEWROUTE, 2, 1, 0) + body


ROUTES: dict[int, list[bytes]] = {
    socket.AF_INET: [
        _route(socket.AF_INET, 254, 3, bytes([10, 0, 0, 1]), 0),
        _route(socket.AF_INET, 254, 3, None, 100),
        _route(socket.AF_INET, 254, 4, bytes([10, 0, 0, 2]), 0),
        _route(socket.AF_INET, 100, 3, bytes([10, 0, 0, 1]), 0),
    ],
    socket.AF_INET6: [_route(socket.AF_INET6, 254, 3, bytes(15) + b"\1", 1024)],
}


# A link without attributes: what a GETLINK gets back (a PF reporting no VF).
LINK = struct.pack("=IHHII", 32, RTM_NEWLINK, 0, 1, 0) + struct.pack("=BxHiII", 0, 1, 7, 0, 0)


class Recorder(Rtnl):
    """An Rtnl without a socket: records requests; GETLINK gets LINK, route dumps ROUTES."""

    def __init__(self) -> None:  # no socket: no super()
        self.sent: list[list[object]] = []

    def request(self, msg_type: int, body: bytes, flags: int = 0) -> list[bytes]:
        self.sent.append([msg_type, body.hex(), flags])
        return [LINK] if msg_type == RTM_GETLINK else []

    def dump(self, msg_type: int, body: bytes) -> list[bytes]:
        self.sent.append([msg_type, body.hex(), -1])
        return ROUTES.get(body[0], []) if msg_type == RTM_GETROUTE else []


CASES: dict[str, Callable[[Recorder], object]] = {
    "macvlan into a netns with mtu and mac": lambda nl: link.create_child(
        nl, "macvlan", "plxtmp", 3, 4, netns=9, mtu=1400, mac="02:11:22:33:44:55"
    ),
    "macvlan source mode, plain": lambda nl: link.create_child(nl, "macvlan", "plx12345678", 3, 16),
    "macvlan bcqueuelen": lambda nl: link.create_child(
        nl, "macvlan", "plxtmp", 3, 4, bcqueuelen=2345
    ),
    "ipvlan ignores bcqueuelen": lambda nl: link.create_child(
        nl, "ipvlan", "plxtmp", 3, 1, bcqueuelen=2345
    ),
    "ipvlan l3s into a netns with mtu": lambda nl: link.create_child(
        nl, "ipvlan", "plxtmp", 3, 2, netns=5, mtu=9000
    ),
    "rename and up": lambda nl: link.set_link(nl, 7, name="net1", up=True),
    "rename": lambda nl: link.set_link(nl, 7, name="net2"),
    "down": lambda nl: link.set_link(nl, 7, up=False),
    "mac and netns": lambda nl: link.set_link(nl, 7, mac="02:00:00:00:00:01", netns_fd=9),
    "rename, mac and up": lambda nl: link.set_link(
        nl, 7, name="eth0", mac="0a:0b:0c:0d:0e:0f", up=True
    ),
    "delete altname": lambda nl: link.delete_altname(nl, 7, "enp0s1"),
    "delete link": lambda nl: link.delete_link(nl, index=7),
    "find link by name": lambda nl: link.find_link(nl, "net1"),
    "find link by index": lambda nl: link.find_link(nl, index=12),
    "dump links": lambda nl: link.links(nl),
    "ipv4 address": lambda nl: link.add_address(nl, 5, ip_interface("10.1.2.3/24")),
    "ipv4 /31 address": lambda nl: link.add_address(nl, 5, ip_interface("10.1.2.3/31")),
    "ipv4 /32 address": lambda nl: link.add_address(nl, 5, ip_interface("10.1.2.3/32")),
    "ipv6 address": lambda nl: link.add_address(nl, 5, ip_interface("fd00::3/64")),
    "dump addresses": lambda nl: link.addresses(nl, 5),
    "dump ipv6 addresses": lambda nl: link.addresses(nl, 5, socket.AF_INET6),
    "route with metrics, priority, table": lambda nl: link.add_route(
        nl,
        5,
        ip_network("10.9.0.0/16"),
        ip_address("10.1.2.1"),
        mtu=1300,
        advmss=1200,
        priority=7,
        table=1000,
    ),
    "default route without gateway": lambda nl: link.add_route(
        nl, 5, ip_network("0.0.0.0/0"), None
    ),
    "replace the default route": lambda nl: link.add_route(
        nl, 5, ip_network("0.0.0.0/0"), ip_address("10.1.2.1"), replace=True
    ),
    "ipv6 route with scope, table, mtu": lambda nl: link.add_route(
        nl, 6, ip_network("fd00:1::/64"), ip_address("fd00::1"), table=100, scope=253, mtu=1280
    ),
    "ipv6 default route with priority": lambda nl: link.add_route(
        nl, 6, ip_network("::/0"), ip_address("fe80::1"), priority=1024
    ),
    "dump ipv4 routes": lambda nl: link.routes(nl, socket.AF_INET),
    "dump ipv6 routes": lambda nl: link.routes(nl, socket.AF_INET6, 1000),
    "delete default routes": lambda nl: link.delete_default_routes(nl, socket.AF_INET, 3),
    "delete ipv6 default routes": lambda nl: link.delete_default_routes(nl, socket.AF_INET6, 3),
    "vf mac": lambda nl: vf.set_setting(nl, 7, 2, "mac", "02:00:00:00:00:01"),
    "vf vlan 802.1q": lambda nl: vf.set_setting(nl, 7, 2, "vlan", [100, 3, 0x8100]),
    "vf vlan 802.1ad": lambda nl: vf.set_setting(nl, 7, 2, "vlan", [100, 3, 0x88A8]),
    "vf vlan 0 with 802.1ad": lambda nl: vf.set_setting(nl, 7, 2, "vlan", [0, 0, 0x88A8]),
    "vf rate": lambda nl: vf.set_setting(nl, 7, 2, "rate", [10, 100]),
    "vf spoofchk": lambda nl: vf.set_setting(nl, 7, 2, "spoofchk", 1),
    "vf trust": lambda nl: vf.set_setting(nl, 7, 2, "trust", 0),
    "vf link state": lambda nl: vf.set_setting(nl, 7, 2, "link_state", 2),
    "vf settings read": lambda nl: vf.read_settings(nl, 7, 2),
}


def _sent(case: str) -> list[list[object]]:
    nl = Recorder()
    with contextlib.suppress(CNIError):  # read_settings: the PF reports no VF
        CASES[case](nl)
    return nl.sent


@pytest.mark.parametrize("case", CASES)
def test_request_bytes_are_the_struct_encoders(case: str) -> None:
    assert _sent(case) == EXPECTED[case]


@pytest.mark.parametrize("limit", [1, 2, 1024])
def test_remembered_parts_give_the_same_bytes(monkeypatch: pytest.MonkeyPatch, limit: int) -> None:
    """Every request twice, its parts remembered or forgotten as the table fills up."""
    monkeypatch.setattr(rtnl, "_PARTS_LIMIT", limit)
    monkeypatch.setattr(rtnl, "_parts", {})
    for case in [*CASES, *CASES]:
        assert _sent(case) == EXPECTED[case], case


def test_every_expected_request_has_a_case() -> None:
    assert set(EXPECTED) == set(CASES)

"""The rtnetlink wire layer and the messages delegates.link builds, without a kernel.

The requests are pyroute2's encoding; they are checked here against the kernel's own
attribute numbers and layouts, written out below independently of pyroute2's tables, and
the canned replies are built with struct, as the kernel lays them out.
"""

from __future__ import annotations

import socket
import struct
from ipaddress import ip_address, ip_interface, ip_network

import pytest

from delegates import link
from delegates.rtnl import (
    HEADER,
    NLM_F_APPEND,
    NLM_F_CREATE,
    NLM_F_EXCL,
    LinkMsg,
    Rtnl,
    get_str,
    get_u32,
    numbers,
    parse_attrs,
)

# linux/if_link.h, if_addr.h, rtnetlink.h
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_LINK, IFLA_LINKINFO, IFLA_NET_NS_FD = 1, 3, 4, 5, 18, 28
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
IFLA_MACVLAN_MODE = IFLA_IPVLAN_MODE = 1
IFLA_MACVLAN_BC_QUEUE_LEN = 7
IFA_ADDRESS, IFA_LOCAL, IFA_BROADCAST = 1, 2, 4
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_METRICS, RTA_MULTIPATH, RTA_TABLE = (
    1, 4, 5, 6, 8, 9, 15,
)  # fmt: skip
RTAX_MTU, RTAX_ADVMSS = 2, 8


def attr(kind: int, payload: bytes) -> bytes:
    size = 4 + len(payload)
    return struct.pack("=HH", size, kind) + payload + b"\0" * (-size % 4)


def attr_str(kind: int, value: str) -> bytes:
    return attr(kind, value.encode() + b"\0")


def attr_u16(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack("=H", value))


def attr_u32(kind: int, value: int) -> bytes:
    return attr(kind, struct.pack("=I", value))


def test_pyroute2_tables_give_the_kernels_numbers() -> None:
    data = LinkMsg.ifinfo.data_map
    assert {name: link.IFLA[name] for name in ("IFLA_ADDRESS", "IFLA_IFNAME", "IFLA_MTU")} == {
        "IFLA_ADDRESS": IFLA_ADDRESS,
        "IFLA_IFNAME": IFLA_IFNAME,
        "IFLA_MTU": IFLA_MTU,
    }
    assert (link.IFLA["IFLA_LINK"], link.IFLA["IFLA_LINKINFO"]) == (IFLA_LINK, IFLA_LINKINFO)
    assert link.IFLA["IFLA_NET_NS_FD"] == IFLA_NET_NS_FD
    assert (link.IFLA_INFO["IFLA_INFO_KIND"], link.IFLA_INFO["IFLA_INFO_DATA"]) == (1, 2)
    macvlan = numbers(data["macvlan"])
    assert macvlan["IFLA_MACVLAN_MODE"] == IFLA_MACVLAN_MODE
    assert macvlan["IFLA_MACVLAN_BC_QUEUE_LEN"] == IFLA_MACVLAN_BC_QUEUE_LEN
    assert numbers(data["ipvlan"])["IFLA_IPVLAN_MODE"] == IFLA_IPVLAN_MODE
    assert [link.IFA[n] for n in ("IFA_ADDRESS", "IFA_LOCAL", "IFA_BROADCAST")] == [1, 2, 4]
    rta = ("RTA_DST", "RTA_OIF", "RTA_GATEWAY", "RTA_PRIORITY", "RTA_METRICS", "RTA_MULTIPATH")
    assert [link.RTA[n] for n in (*rta, "RTA_TABLE")] == [1, 4, 5, 6, 8, 9, 15]
    assert link.IFINFO.format == "=BxHiII" and link.RTMSG.format == "=BBBBBBBBI"
    assert link.IFADDR.format == "=BBBBI" and link.NEXTHOP.format == "=HBBi"


class Recorder(Rtnl):
    """An Rtnl without a socket: records requests, answers dumps with canned messages."""

    def __init__(self, dumps: list[bytes] | None = None) -> None:  # no socket: no super()
        self.sent: list[tuple[int, bytes, int]] = []
        self.dumps = dumps or []

    def request(self, msg_type: int, body: bytes, flags: int = 0) -> list[bytes]:
        self.sent.append((msg_type, body, flags))
        return []

    def dump(self, msg_type: int, body: bytes) -> list[bytes]:
        self.sent.append((msg_type, body, 0))
        return self.dumps


def _msg(msg_type: int, body: bytes) -> bytes:
    return HEADER.pack(HEADER.size + len(body), msg_type, 0, 1, 0) + body


def test_attributes_are_padded_and_parsed_back() -> None:
    data = attr_str(3, "eth0") + attr_u16(7, 2) + attr_u32(4, 1500) + attr(1, b"\x02" * 6)
    assert len(attr_str(3, "eth0")) == 12  # 4 header + "eth0\0" + 3 padding
    attrs = parse_attrs(data)
    assert get_str(attrs, 3) == "eth0"
    assert struct.unpack("=H", attrs[7]) == (2,)
    assert get_u32(attrs, 4) == 1500
    assert attrs[1] == b"\x02" * 6
    assert get_u32(attrs, 99) is None and get_str(attrs, 99) == ""


def test_nested_flag_is_masked_and_truncated_attributes_are_ignored() -> None:
    nested = struct.pack("=HH", 8, 18 | 0x8000) + b"abcd"
    assert parse_attrs(nested) == {18: b"abcd"}
    assert parse_attrs(struct.pack("=HH", 40, 3) + b"short") == {}


def test_create_child_sends_one_newlink_with_every_attribute() -> None:
    nl = Recorder()
    link.create_child(nl, "macvlan", "plxtmp", 3, 4, netns=9, mtu=1400, mac="02:11:22:33:44:55")
    [(msg_type, body, flags)] = nl.sent
    assert msg_type == link.RTM_NEWLINK and flags == NLM_F_CREATE | NLM_F_EXCL
    assert link.IFINFO.unpack_from(body) == (socket.AF_UNSPEC, 0, 0, 0, 0)
    attrs = parse_attrs(body, link.IFINFO.size)
    assert get_str(attrs, IFLA_IFNAME) == "plxtmp"
    assert get_u32(attrs, IFLA_LINK) == 3
    assert get_u32(attrs, IFLA_NET_NS_FD) == 9
    assert get_u32(attrs, IFLA_MTU) == 1400
    assert attrs[IFLA_ADDRESS] == bytes.fromhex("021122334455")
    info = parse_attrs(attrs[IFLA_LINKINFO])
    assert get_str(info, IFLA_INFO_KIND) == "macvlan"
    data = parse_attrs(info[IFLA_INFO_DATA])
    assert get_u32(data, IFLA_MACVLAN_MODE) == 4
    assert IFLA_MACVLAN_BC_QUEUE_LEN not in data  # 0: the kernel's default


def test_macvlan_bcqueuelen_is_a_u32_in_info_data() -> None:
    nl = Recorder()
    link.create_child(nl, "macvlan", "plxtmp", 3, 4, bcqueuelen=2345)
    link.create_child(nl, "ipvlan", "plxtmp", 3, 1, bcqueuelen=2345)  # macvlan only
    datas = [
        parse_attrs(parse_attrs(parse_attrs(body, link.IFINFO.size)[IFLA_LINKINFO])[IFLA_INFO_DATA])
        for _, body, _ in nl.sent
    ]
    assert IFLA_MACVLAN_BC_QUEUE_LEN == 7
    assert datas[0] == {
        IFLA_MACVLAN_MODE: struct.pack("=I", 4),
        IFLA_MACVLAN_BC_QUEUE_LEN: struct.pack("=I", 2345),
    }
    assert datas[1] == {IFLA_IPVLAN_MODE: struct.pack("=H", 1)}


def test_ipvlan_mode_is_a_u16_and_optional_attributes_are_left_out() -> None:
    nl = Recorder()
    link.create_child(nl, "ipvlan", "plxtmp", 3, 1)
    attrs = parse_attrs(nl.sent[0][1], link.IFINFO.size)
    assert set(attrs) == {IFLA_IFNAME, IFLA_LINK, IFLA_LINKINFO}
    data = parse_attrs(parse_attrs(attrs[IFLA_LINKINFO])[IFLA_INFO_DATA])
    assert data[IFLA_IPVLAN_MODE] == struct.pack("=H", 1)


def test_set_link_renames_and_brings_up_in_one_message() -> None:
    nl = Recorder()
    link.set_link(nl, 7, name="net1", up=True)
    link.set_link(nl, 7, name="net2")
    (_, up, _), (_, plain, _) = nl.sent
    assert link.IFINFO.unpack_from(up)[2:] == (7, link.IFF_UP, link.IFF_UP)
    assert link.IFINFO.unpack_from(plain)[2:] == (7, 0, 0)
    assert get_str(parse_attrs(plain, link.IFINFO.size), IFLA_IFNAME) == "net2"


def test_set_link_down_mac_and_namespace() -> None:
    nl = Recorder()
    link.set_link(nl, 7, up=False)
    link.set_link(nl, 7, mac="02:00:00:00:00:01", netns_fd=9)
    (_, down, _), (_, moved, _) = nl.sent
    assert link.IFINFO.unpack_from(down)[2:] == (7, 0, link.IFF_UP)
    assert link.IFINFO.unpack_from(moved)[2:] == (7, 0, 0)
    attrs = parse_attrs(moved, link.IFINFO.size)
    assert attrs[IFLA_ADDRESS] == bytes.fromhex("020000000001")
    assert get_u32(attrs, IFLA_NET_NS_FD) == 9


def test_addresses_get_local_and_broadcast_only_for_ipv4() -> None:
    nl = Recorder()
    link.add_address(nl, 5, ip_interface("10.1.2.3/24"))
    link.add_address(nl, 5, ip_interface("10.1.2.3/31"))
    link.add_address(nl, 5, ip_interface("fd00::3/64"))
    v4, p2p, v6 = (parse_attrs(body, link.IFADDR.size) for _, body, _ in nl.sent)
    assert v4[IFA_LOCAL] == v4[IFA_ADDRESS] == ip_address("10.1.2.3").packed
    assert v4[IFA_BROADCAST] == ip_address("10.1.2.255").packed
    assert IFA_BROADCAST not in p2p
    assert set(v6) == {IFA_ADDRESS}
    assert link.IFADDR.unpack_from(nl.sent[2][1]) == (socket.AF_INET6, 64, 0, 0, 5)


def test_route_carries_table_priority_and_metrics() -> None:
    nl = Recorder()
    link.add_route(
        nl,
        5,
        ip_network("10.9.0.0/16"),
        ip_address("10.1.2.1"),
        mtu=1300,
        advmss=1200,
        priority=7,
        table=1000,
    )
    link.add_route(nl, 5, ip_network("0.0.0.0/0"), None)
    (_, body, flags), (_, default, _) = nl.sent
    assert flags == NLM_F_CREATE | NLM_F_APPEND
    header = link.RTMSG.unpack_from(body)
    assert header[:8] == (socket.AF_INET, 16, 0, 0, link.RT_TABLE_MAIN, 3, 0, 1)
    attrs = parse_attrs(body, link.RTMSG.size)
    assert attrs[RTA_DST] == ip_address("10.9.0.0").packed
    assert get_u32(attrs, RTA_OIF) == 5
    assert get_u32(attrs, RTA_TABLE) == 1000
    assert get_u32(attrs, RTA_PRIORITY) == 7
    metrics = parse_attrs(attrs[RTA_METRICS])
    assert (get_u32(metrics, RTAX_MTU), get_u32(metrics, RTAX_ADVMSS)) == (1300, 1200)
    assert set(parse_attrs(default, link.RTMSG.size)) == {RTA_OIF, RTA_TABLE}


def _link_msg(kind: str, mode: bytes) -> bytes:
    info = attr_str(IFLA_INFO_KIND, kind) + attr(
        IFLA_INFO_DATA | 0x8000, attr(IFLA_MACVLAN_MODE, mode)
    )
    body = link.IFINFO.pack(0, 1, 12, 0x11043, 0) + attr_str(IFLA_IFNAME, "net1")
    body += attr_u32(IFLA_MTU, 1500) + attr(IFLA_ADDRESS, bytes.fromhex("02AB00000001"))
    return _msg(link.RTM_NEWLINK, body + attr(IFLA_LINKINFO | 0x8000, info))


@pytest.mark.parametrize(
    ("kind", "mode", "want"),
    [
        ("macvlan", struct.pack("=I", 8), 8),
        ("ipvlan", struct.pack("=H", 2), 2),
        ("veth", b"", None),
    ],
)
def test_parse_link(kind: str, mode: bytes, want: int | None) -> None:
    got = link.parse_link(_link_msg(kind, mode))
    assert (got.index, got.name, got.kind, got.mtu, got.mac) == (
        12,
        "net1",
        kind,
        1500,
        "02:ab:00:00:00:01",
    )
    assert got.mode == want and got.carrier


def _route_msg(table: int, dst: bytes, dst_len: int, extra: bytes) -> bytes:
    body = link.RTMSG.pack(socket.AF_INET, dst_len, 0, 0, table & 0xFF, 3, 0, 1, 0)
    body += attr_u32(RTA_TABLE, table) + (attr(RTA_DST, dst) if dst else b"") + extra
    return _msg(link.RTM_NEWROUTE, body)


def test_route_dump_filters_the_table_and_splits_multipath() -> None:
    hop = link.NEXTHOP.pack(16, 0, 0, 4) + attr(RTA_GATEWAY, bytes([10, 0, 0, 1]))
    hop2 = link.NEXTHOP.pack(8, 0, 0, 5)
    nl = Recorder(
        [
            _route_msg(254, b"", 0, attr_u32(RTA_OIF, 3)),
            _route_msg(255, bytes([127, 0, 0, 1]), 32, attr_u32(RTA_OIF, 1)),
            _route_msg(254, bytes([10, 9, 0, 0]), 16, attr(RTA_MULTIPATH, hop + hop2)),
        ]
    )
    got = link.routes(nl, socket.AF_INET)
    assert got == [
        link.RouteEntry(ip_network("0.0.0.0/0"), None, 3),
        link.RouteEntry(ip_network("10.9.0.0/16"), ip_address("10.0.0.1"), 4),
        link.RouteEntry(ip_network("10.9.0.0/16"), None, 5),
    ]

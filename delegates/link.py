"""Netlink helpers for the delegate plugins: one small function per kernel operation.

Each helper takes an open `Rtnl` (delegates.rtnl) bound to the namespace it should act
in: open it with `netlink()` on a thread that is already in that namespace, e.g. inside
`delegates.netns.run_in_netns`. The messages carry the flags and attributes iproute2
and vishvananda/netlink send, built here with struct. Kernel errors surface as OSError; the
helpers that wrap them raise CNIError(PLUGIN_ERROR), the code the reference plugins
report for their own failures.
"""

from __future__ import annotations

import errno
import os
import secrets
import socket
import struct
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from ipaddress import IPv4Interface, ip_address, ip_interface, ip_network

from cni.errors import CNIError
from cni.result import IPAddress, IPInterface, IPNetwork
from delegates.netns import open_netns
from delegates.rtnl import (
    NLM_F_APPEND,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NLM_F_REPLACE,
    Rtnl,
    attr,
    attr_str,
    attr_u16,
    attr_u32,
    get_str,
    get_u32,
    parse_attrs,
)

PLUGIN_ERROR = 999
"""libcni's ErrInternal: the reference plugins wrap every error of their own in it."""

IFF_UP = 0x1
IFF_LOWER_UP = 0x10000
IFA_F_DADFAILED = 0x08
IFA_F_TENTATIVE = 0x40
RT_TABLE_MAIN = 254
RTPROT_BOOT = 3  # what vishvananda/netlink (and so the reference plugins) stamps on routes
RTN_UNICAST = 1

# rtnetlink message types, headers and attributes (linux/rtnetlink.h, if_link.h, if_addr.h)
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK, RTM_DELLINKPROP = 16, 17, 18, 109
RTM_NEWADDR, RTM_GETADDR = 20, 22
RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefixlen, flags, scope, index
RTMSG = struct.Struct("=BBBBBBBBI")  # rtmsg: family, dst_len, src_len, tos, table, proto,
#                                      scope, type, flags
NEXTHOP = struct.Struct("=HBBi")  # rtnexthop: len, flags, hops, ifindex
IFLA_ADDRESS, IFLA_IFNAME, IFLA_MTU, IFLA_LINK, IFLA_LINKINFO, IFLA_NET_NS_FD = 1, 3, 4, 5, 18, 28
IFLA_PROP_LIST, IFLA_ALT_IFNAME = 52, 53
NLA_F_NESTED = 0x8000
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
IFLA_MACVLAN_MODE = IFLA_IPVLAN_MODE = 1  # u32 for macvlan, u16 for ipvlan
IFLA_MACVLAN_BC_QUEUE_LEN = 7  # u32, Linux 5.11+
IFA_ADDRESS, IFA_LOCAL, IFA_BROADCAST, IFA_FLAGS = 1, 2, 4, 8
RTA_DST, RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_METRICS, RTA_MULTIPATH, RTA_TABLE = (
    1, 4, 5, 6, 8, 9, 15,
)  # fmt: skip
RTAX_MTU, RTAX_ADVMSS = 2, 8


def fail(msg: str, details: str = "") -> CNIError:
    """A plugin failure as the reference reports it (code 999)."""
    return CNIError(PLUGIN_ERROR, msg, details)


def errno_of(exc: BaseException) -> int | None:
    """The errno behind an OSError, else None."""
    return exc.errno if isinstance(exc, OSError) else None


def describe(exc: BaseException) -> str:
    """A kernel error as Go's syscall.Errno prints it ("no such device")."""
    code = errno_of(exc)
    text = os.strerror(code) if code else str(exc)
    return text[:1].lower() + text[1:]


@contextmanager
def netlink() -> Iterator[Rtnl]:
    """An rtnetlink socket in the calling thread's network namespace."""
    with Rtnl() as nl:
        yield nl


@contextmanager
def netns_fd(path: str) -> Iterator[int]:
    """An open descriptor of the namespace at `path` (for IFLA_NET_NS_FD)."""
    fd = open_netns(path)
    try:
        yield fd
    finally:
        os.close(fd)


def temp_name() -> str:
    """A random interface name to create links under before renaming them."""
    return "plx" + secrets.token_hex(4)


@dataclass(frozen=True)
class Link:
    """The parts of an RTM_NEWLINK message the plugins look at."""

    index: int
    name: str
    kind: str
    mtu: int
    mac: str
    flags: int
    mode: int | None  # IFLA_MACVLAN_MODE / IFLA_IPVLAN_MODE of a macvlan / ipvlan

    @property
    def carrier(self) -> bool:
        return bool(self.flags & IFF_LOWER_UP)


def ifinfo(index: int = 0, flags: int = 0, change: int = 0) -> bytes:
    """An ifinfomsg header for link `index`."""
    return IFINFO.pack(socket.AF_UNSPEC, 0, index, flags, change)


def parse_link(msg: bytes) -> Link:
    """An RTM_NEWLINK message (netlink header included) as a Link."""
    _, _, index, flags, _ = IFINFO.unpack_from(msg, 16)
    attrs = parse_attrs(msg, 16 + IFINFO.size)
    info = parse_attrs(attrs.get(IFLA_LINKINFO, b""))
    kind = get_str(info, IFLA_INFO_KIND)
    mode = None
    if kind in ("macvlan", "ipvlan"):
        data = parse_attrs(info.get(IFLA_INFO_DATA, b"")).get(IFLA_MACVLAN_MODE, b"")
        fmt = "=I" if kind == "macvlan" else "=H"
        if len(data) >= struct.calcsize(fmt):
            mode = int(struct.unpack_from(fmt, data)[0])
    return Link(
        index=index,
        name=get_str(attrs, IFLA_IFNAME),
        kind=kind,
        mtu=get_u32(attrs, IFLA_MTU) or 0,
        mac=":".join(f"{b:02x}" for b in attrs.get(IFLA_ADDRESS, b"")),
        flags=flags,
        mode=mode,
    )


def find_link(nl: Rtnl, name: str = "", index: int = 0) -> Link | None:
    """The link called `name` (or with `index`), or None if there is none."""
    body = ifinfo(index) if index else ifinfo() + attr_str(IFLA_IFNAME, name)
    try:
        msgs = nl.request(RTM_GETLINK, body)
    except OSError as exc:
        # EINVAL: a name the kernel cannot hold (too long), so no such link either.
        if exc.errno == errno.ENODEV or (not index and exc.errno == errno.EINVAL):
            return None
        raise fail(f"failed to look up link {name or index}: {describe(exc)}") from None
    return parse_link(msgs[0]) if msgs else None


def links(nl: Rtnl) -> list[Link]:
    """Every link in the namespace."""
    return [parse_link(msg) for msg in nl.dump(RTM_GETLINK, ifinfo())]


def default_route_link(nl: Rtnl) -> str:
    """The interface of the first default route in the main table (IPv4 first)."""
    for family in (socket.AF_INET, socket.AF_INET6):
        for route in _route_msgs(nl, family, RT_TABLE_MAIN):
            if route.dst.prefixlen == 0 and route.oif:
                link = find_link(nl, index=route.oif)
                if link is not None:
                    return link.name
    raise fail("no default route interface found")


def create_child(
    nl: Rtnl,
    kind: str,
    name: str,
    parent: int,
    mode: int,
    *,
    netns: int | None = None,
    mtu: int = 0,
    mac: str = "",
    bcqueuelen: int = 0,
) -> None:
    """Create a macvlan/ipvlan `name` on link index `parent`, optionally straight into the
    namespace behind descriptor `netns`. `mtu`, `mac` and a macvlan's `bcqueuelen` (broadcast
    queue length) are sent only when set, so 0/"" leave the kernel's defaults, as
    vishvananda/netlink does. Raises the kernel error unchanged (OSError)."""
    body = ifinfo() + attr_str(IFLA_IFNAME, name) + attr_u32(IFLA_LINK, parent)
    if netns is not None:
        body += attr_u32(IFLA_NET_NS_FD, netns)
    if mtu:
        body += attr_u32(IFLA_MTU, mtu)
    if mac:
        body += attr(IFLA_ADDRESS, bytes.fromhex(mac.replace(":", "")))
    if kind == "macvlan":
        data = attr_u32(IFLA_MACVLAN_MODE, mode)
        if bcqueuelen:
            data += attr_u32(IFLA_MACVLAN_BC_QUEUE_LEN, bcqueuelen)
    else:
        data = attr_u16(IFLA_IPVLAN_MODE, mode)
    data = attr(IFLA_INFO_DATA, data)
    body += attr(IFLA_LINKINFO, attr_str(IFLA_INFO_KIND, kind) + data)
    nl.request(RTM_NEWLINK, body, NLM_F_CREATE | NLM_F_EXCL)


def set_link(
    nl: Rtnl,
    index: int,
    *,
    name: str = "",
    up: bool | None = None,
    mac: str = "",
    netns_fd: int | None = None,
) -> None:
    """Change link `index` in one message: rename, MAC, move to the namespace `netns_fd`,
    then set it up or down (`None` leaves its state). The kernel renames before it
    changes flags, so rename and up go together; a rename needs the link down already."""
    body = ifinfo(index, IFF_UP if up else 0, 0 if up is None else IFF_UP)
    if name:
        body += attr_str(IFLA_IFNAME, name)
    if mac:
        body += attr(IFLA_ADDRESS, bytes.fromhex(mac.replace(":", "")))
    if netns_fd is not None:
        body += attr_u32(IFLA_NET_NS_FD, netns_fd)
    nl.request(RTM_NEWLINK, body)


def delete_altname(nl: Rtnl, index: int, name: str) -> None:
    """Drop the alternative name `name` of link `index`."""
    props = attr(IFLA_PROP_LIST | NLA_F_NESTED, attr_str(IFLA_ALT_IFNAME, name))
    nl.request(RTM_DELLINKPROP, ifinfo(index) + props)


def delete_link(nl: Rtnl, name: str = "", index: int = 0) -> bool:
    """Delete the link with `index` (or called `name`); False if it did not exist."""
    if not index:
        link = find_link(nl, name)
        if link is None:
            return False
        index = link.index
    try:
        nl.request(RTM_DELLINK, ifinfo(index))
    except OSError as exc:
        if exc.errno == errno.ENODEV:
            return False
        raise fail(f"failed to delete link {name or index}: {describe(exc)}") from None
    return True


def add_address(nl: Rtnl, index: int, address: IPInterface) -> None:
    """Add an address; IPv4 gets a broadcast address below /31, as vishvananda/netlink."""
    ip = address.ip.packed
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    body = IFADDR.pack(family, address.network.prefixlen, 0, 0, index) + attr(IFA_ADDRESS, ip)
    if isinstance(address, IPv4Interface):
        if address.network.prefixlen < 31:
            body += attr(IFA_BROADCAST, address.network.broadcast_address.packed)
        body += attr(IFA_LOCAL, ip)
    nl.request(RTM_NEWADDR, body, NLM_F_CREATE | NLM_F_EXCL)


def addresses(
    nl: Rtnl, index: int, family: int = socket.AF_UNSPEC
) -> list[tuple[IPInterface, int]]:
    """(address, IFA flags) of every address on link `index`."""
    found = []
    for msg in nl.dump(RTM_GETADDR, IFADDR.pack(family, 0, 0, 0, 0)):
        fam, prefixlen, flags, _, ifindex = IFADDR.unpack_from(msg, 16)
        if ifindex != index:
            continue
        attrs = parse_attrs(msg, 16 + IFADDR.size)
        raw = attrs.get(IFA_ADDRESS) or attrs.get(IFA_LOCAL)
        if raw:
            text = socket.inet_ntop(fam, raw)
            found.append((ip_interface(f"{text}/{prefixlen}"), get_u32(attrs, IFA_FLAGS) or flags))
    return found


def add_route(
    nl: Rtnl,
    index: int,
    dst: IPNetwork,
    gw: IPAddress | None,
    *,
    mtu: int | None = None,
    advmss: int | None = None,
    priority: int | None = None,
    table: int | None = None,
    scope: int | None = None,
    replace: bool = False,
) -> None:
    """Add a route through link `index` like netlink.RouteAddEcmp (no NLM_F_EXCL), or
    replace the one with the same destination and metric (`replace`)."""
    family = socket.AF_INET if dst.version == 4 else socket.AF_INET6
    table = table if table is not None else RT_TABLE_MAIN
    header_table = table if table < 256 else RT_TABLE_MAIN  # RTA_TABLE carries the real one
    body = RTMSG.pack(
        family, dst.prefixlen, 0, 0, header_table, RTPROT_BOOT, scope or 0, RTN_UNICAST, 0
    )
    if dst.prefixlen:
        body += attr(RTA_DST, dst.network_address.packed)
    body += attr_u32(RTA_OIF, index) + attr_u32(RTA_TABLE, table)
    if gw is not None:
        body += attr(RTA_GATEWAY, gw.packed)
    if priority:
        body += attr_u32(RTA_PRIORITY, priority)
    metrics = b"".join(attr_u32(k, v) for k, v in ((RTAX_MTU, mtu), (RTAX_ADVMSS, advmss)) if v)
    if metrics:
        body += attr(RTA_METRICS, metrics)
    nl.request(RTM_NEWROUTE, body, NLM_F_CREATE | (NLM_F_REPLACE if replace else NLM_F_APPEND))


@dataclass(frozen=True)
class RouteEntry:
    """One route of a dump, reduced to what CHECK compares."""

    dst: IPNetwork
    gw: IPAddress | None
    oif: int


@dataclass(frozen=True)
class _RouteMsg:
    dst: IPNetwork
    gw: IPAddress | None
    oif: int
    hops: list[tuple[IPAddress | None, int]]  # (gateway, oif) of a multipath route


def _route_msgs(nl: Rtnl, family: int, table: int) -> list[_RouteMsg]:
    found = []
    for msg in nl.dump(RTM_GETROUTE, RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)):
        fam, dst_len, _, _, header_table, _, _, _, _ = RTMSG.unpack_from(msg, 16)
        attrs = parse_attrs(msg, 16 + RTMSG.size)
        if (get_u32(attrs, RTA_TABLE) or header_table) != table:
            continue
        raw_dst = attrs.get(RTA_DST) or bytes(4 if fam == socket.AF_INET else 16)
        dst = ip_network(f"{socket.inet_ntop(fam, raw_dst)}/{dst_len}", strict=False)
        hops = []
        multipath = attrs.get(RTA_MULTIPATH, b"")
        offset = 0
        while offset + NEXTHOP.size <= len(multipath):
            size, _, _, oif = NEXTHOP.unpack_from(multipath, offset)
            if size < NEXTHOP.size:
                break
            hop = parse_attrs(multipath[offset + NEXTHOP.size : offset + size])
            hops.append((_ip(fam, hop.get(RTA_GATEWAY)), oif))
            offset += (size + 3) & ~3
        gw = _ip(fam, attrs.get(RTA_GATEWAY))
        found.append(_RouteMsg(dst, gw, get_u32(attrs, RTA_OIF) or 0, hops))
    return found


def delete_default_routes(nl: Rtnl, family: int, oif: int) -> int:
    """Delete the main table's default routes of `family` through link `oif`; how many."""
    deleted = 0
    for msg in nl.dump(RTM_GETROUTE, RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)):
        header = RTMSG.unpack_from(msg, 16)
        attrs = parse_attrs(msg, 16 + RTMSG.size)
        table = get_u32(attrs, RTA_TABLE) or header[4]
        if header[1] != 0 or table != RT_TABLE_MAIN or get_u32(attrs, RTA_OIF) != oif:
            continue
        key = b"".join(
            attr(kind, attrs[kind])
            for kind in (RTA_OIF, RTA_GATEWAY, RTA_PRIORITY, RTA_TABLE)
            if kind in attrs
        )
        nl.request(RTM_DELROUTE, msg[16 : 16 + RTMSG.size] + key)
        deleted += 1
    return deleted


def _ip(family: int, raw: bytes | None) -> IPAddress | None:
    return ip_address(socket.inet_ntop(family, raw)) if raw else None


def routes(nl: Rtnl, family: int, table: int = RT_TABLE_MAIN) -> list[RouteEntry]:
    """Every route of `family` in `table` (multipath routes: one entry per hop)."""
    found = []
    for msg in _route_msgs(nl, family, table):
        if msg.hops:
            found += [RouteEntry(msg.dst, gw, oif) for gw, oif in msg.hops]
        else:
            found.append(RouteEntry(msg.dst, msg.gw, msg.oif))
    return found


def read_sysctl(key: str) -> str:
    """A sysctl of the calling thread's network namespace ("net/ipv4/conf/eth0/...")."""
    with open("/proc/sys/" + key) as f:
        return f.read().strip()


def write_sysctl(key: str, value: str) -> None:
    with open("/proc/sys/" + key, "w") as f:
        f.write(value)


def settle_addresses(nl: Rtnl, index: int, timeout: float = 10.0) -> bool:
    """Wait until no IPv6 address of link `index` is tentative; False on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        flags = [f for _, f in addresses(nl, index, socket.AF_INET6)]
        if not any(f & (IFA_F_TENTATIVE | IFA_F_DADFAILED) for f in flags):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)

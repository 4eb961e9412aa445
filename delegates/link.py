"""Netlink helpers for the delegate plugins: one small function per kernel operation.

Each helper takes an open `Rtnl` (delegates.rtnl) bound to the namespace it should act
in: open it with `netlink()` on a thread that is already in that namespace, e.g. inside
`delegates.netns.run_in_netns`. The messages carry the flags and attributes iproute2
and vishvananda/netlink send, encoded by pyroute2's message classes; replies are read
with the attribute numbers and layouts of the same classes (delegates.rtnl). Kernel
errors surface as OSError; the helpers that wrap them raise CNIError(PLUGIN_ERROR), the
code the reference plugins report for their own failures.
"""

from __future__ import annotations

import errno
import os
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from ipaddress import IPv4Interface, ip_address, ip_interface, ip_network
from typing import Any

from cni import callscope
from cni.errors import CNIError
from cni.result import IPAddress, IPInterface, IPNetwork
from delegates.netns import open_netns
from delegates.rtnl import (
    HEADER,
    IFA_F_DADFAILED,
    IFA_F_TENTATIVE,
    IFF_LOWER_UP,
    NLM_F_APPEND,
    NLM_F_CREATE,
    NLM_F_EXCL,
    NLM_F_REPLACE,
    RTM_DELLINK,
    RTM_DELLINKPROP,
    RTM_DELROUTE,
    RTM_GETADDR,
    RTM_GETLINK,
    RTM_GETROUTE,
    RTM_NEWADDR,
    AddrMsg,
    LinkMsg,
    NextHop,
    RouteMsg,
    Rtnl,
    attr_class,
    encode,
    fields_of,
    get_str,
    get_u32,
    header_of,
    nested,
    numbers,
    parse_attrs,
    rtprotos,
    rtypes,
)

# Re-exported: callers read link flags and match message types with them.
from delegates.rtnl import IFF_UP as IFF_UP
from delegates.rtnl import RTM_NEWLINK as RTM_NEWLINK
from delegates.rtnl import RTM_NEWROUTE as RTM_NEWROUTE

PLUGIN_ERROR = 999
"""libcni's ErrInternal: the reference plugins wrap every error of their own in it."""

RT_TABLE_MAIN = 254  # linux/rtnetlink.h; pyroute2 names routing tables only from rt_tables
RTPROT_BOOT = rtprotos["RTPROT_BOOT"]  # what vishvananda/netlink (so the reference) stamps
RTN_UNICAST = rtypes["RTN_UNICAST"]

# Where the replies' fixed headers and attributes are, as pyroute2's classes define them.
IFINFO = header_of(LinkMsg)  # ifinfomsg: family, type, index, flags, change
IFADDR = header_of(AddrMsg)  # ifaddrmsg: family, prefixlen, flags, scope, index
RTMSG = header_of(RouteMsg)  # rtmsg: family, dst_len, src_len, tos, table, proto, scope,
#                              type, flags
NEXTHOP = header_of(NextHop)  # rtnexthop: len, flags, hops, ifindex
IFLA = numbers(LinkMsg)
IFLA_INFO = numbers(LinkMsg.ifinfo)
IFA = numbers(AddrMsg)
RTA = numbers(RouteMsg)
# kind -> (its IFLA_INFO_DATA class, the attribute holding its mode)
_MODE_ATTRS = {
    "macvlan": (LinkMsg.ifinfo.data_map["macvlan"], "IFLA_MACVLAN_MODE"),
    "ipvlan": (LinkMsg.ifinfo.data_map["ipvlan"], "IFLA_IPVLAN_MODE"),
}


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


def parse_link(msg: bytes) -> Link:
    """An RTM_NEWLINK message (netlink header included) as a Link."""
    _, _, index, flags, _ = IFINFO.unpack_from(msg, HEADER.size)
    attrs = parse_attrs(msg, HEADER.size + IFINFO.size)
    info = parse_attrs(attrs.get(IFLA["IFLA_LINKINFO"], b""))
    kind = get_str(info, IFLA_INFO["IFLA_INFO_KIND"])
    mode = None
    if kind in _MODE_ATTRS:
        data_class, name = _MODE_ATTRS[kind]
        data = parse_attrs(info.get(IFLA_INFO["IFLA_INFO_DATA"], b""))
        value = data.get(numbers(data_class)[name], b"")
        mode = fields_of(attr_class(data_class, name), value).get("value")
    return Link(
        index=index,
        name=get_str(attrs, IFLA["IFLA_IFNAME"]),
        kind=kind,
        mtu=get_u32(attrs, IFLA["IFLA_MTU"]) or 0,
        mac=":".join(f"{b:02x}" for b in attrs.get(IFLA["IFLA_ADDRESS"], b"")),
        flags=flags,
        mode=mode,
    )


def link_body(
    index: int = 0, attrs: list[Any] | None = None, flags: int = 0, change: int = 0
) -> bytes:
    """An AF_UNSPEC ifinfomsg for link `index` (0: the link the attributes name)."""
    return encode(LinkMsg, attrs, index=index, flags=flags, change=change)


def find_link(nl: Rtnl, name: str = "", index: int = 0) -> Link | None:
    """The link called `name` (or with `index`), or None if there is none."""
    body = link_body(index) if index else link_body(attrs=[("IFLA_IFNAME", name)])
    try:
        msgs = nl.request(RTM_GETLINK, body)
    except OSError as exc:
        # EINVAL: a name the kernel cannot hold (too long), so no such link either.
        if exc.errno == errno.ENODEV or (not index and exc.errno == errno.EINVAL):
            return None
        raise fail(f"failed to look up link {name or index}: {describe(exc)}") from None
    return parse_link(msgs[0]) if msgs else None


def link_index(name: str) -> int | None:
    """The index of the link called `name` in the calling thread's namespace, or None.

    For callers that need only the index: one SIOCGIFINDEX ioctl, which finds a link by
    its name or an altname as RTM_GETLINK by IFLA_IFNAME does, with nothing to encode or
    decode (docs/architecture.md, "Netlink on pyroute2's message classes")."""
    try:
        return socket.if_nametoindex(name)
    except (OSError, ValueError):  # no such link; a name with a NUL byte cannot be one
        return None


def links(nl: Rtnl) -> list[Link]:
    """Every link in the namespace."""
    return [parse_link(msg) for msg in nl.dump(RTM_GETLINK, link_body())]


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
    up: bool = False,
) -> None:
    """Create a macvlan/ipvlan `name` on link index `parent`, optionally straight into the
    namespace behind descriptor `netns`, and `up` if asked. `mtu`, `mac` and a macvlan's
    `bcqueuelen` (broadcast queue length) are sent only when set, so 0/"" leave the
    kernel's defaults, as vishvananda/netlink does. Raises the kernel error unchanged
    (OSError)."""
    attrs: list[Any] = [("IFLA_IFNAME", name), ("IFLA_LINK", parent)]
    if netns is not None:
        attrs.append(("IFLA_NET_NS_FD", netns))
    if mtu:
        attrs.append(("IFLA_MTU", mtu))
    if mac:
        attrs.append(("IFLA_ADDRESS", mac))
    data = [(_MODE_ATTRS[kind][1], mode)]
    if kind == "macvlan" and bcqueuelen:
        data.append(("IFLA_MACVLAN_BC_QUEUE_LEN", bcqueuelen))
    # iproute2 and vishvananda/netlink send IFLA_INFO_DATA without NLA_F_NESTED
    info = nested(("IFLA_INFO_KIND", kind), ("IFLA_INFO_DATA", nested(*data)))
    attrs.append(("IFLA_LINKINFO", info))
    flags = IFF_UP if up else 0
    nl.request(
        RTM_NEWLINK, link_body(attrs=attrs, flags=flags, change=flags), NLM_F_CREATE | NLM_F_EXCL
    )


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
    attrs: list[Any] = []
    if name:
        attrs.append(("IFLA_IFNAME", name))
    if mac:
        attrs.append(("IFLA_ADDRESS", mac))
    if netns_fd is not None:
        attrs.append(("IFLA_NET_NS_FD", netns_fd))
    body = link_body(index, attrs, IFF_UP if up else 0, 0 if up is None else IFF_UP)
    nl.request(RTM_NEWLINK, body)


def delete_altname(nl: Rtnl, index: int, name: str) -> None:
    """Drop the alternative name `name` of link `index`."""
    props = ("IFLA_PROP_LIST", nested(("IFLA_ALT_IFNAME", name)))
    nl.request(RTM_DELLINKPROP, link_body(index, [props]))


def delete_link(nl: Rtnl, name: str = "", index: int = 0) -> bool:
    """Delete the link with `index` (or called `name`); False if it did not exist."""
    if not index:
        link = find_link(nl, name)
        if link is None:
            return False
        index = link.index
    try:
        nl.request(RTM_DELLINK, link_body(index))
    except OSError as exc:
        if exc.errno == errno.ENODEV:
            return False
        raise fail(f"failed to delete link {name or index}: {describe(exc)}") from None
    return True


def _family(version: int) -> int:
    return socket.AF_INET if version == 4 else socket.AF_INET6


def add_address(nl: Rtnl, index: int, address: IPInterface) -> None:
    """Add an address; IPv4 gets a broadcast address below /31, as vishvananda/netlink."""
    ip = str(address.ip)
    attrs: list[Any] = [("IFA_ADDRESS", ip)]
    if isinstance(address, IPv4Interface):
        if address.network.prefixlen < 31:
            attrs.append(("IFA_BROADCAST", str(address.network.broadcast_address)))
        attrs.append(("IFA_LOCAL", ip))
    family, prefixlen = _family(address.version), address.network.prefixlen
    body = encode(AddrMsg, attrs, family=family, prefixlen=prefixlen, index=index)
    nl.request(RTM_NEWADDR, body, NLM_F_CREATE | NLM_F_EXCL)


def addresses(
    nl: Rtnl, index: int, family: int = socket.AF_UNSPEC
) -> list[tuple[IPInterface, int]]:
    """(address, IFA flags) of every address on link `index`."""
    found = []
    for msg in nl.dump(RTM_GETADDR, encode(AddrMsg, family=family)):
        fam, prefixlen, flags, _, ifindex = IFADDR.unpack_from(msg, HEADER.size)
        if ifindex != index:
            continue
        attrs = parse_attrs(msg, HEADER.size + IFADDR.size)
        raw = attrs.get(IFA["IFA_ADDRESS"]) or attrs.get(IFA["IFA_LOCAL"])
        if raw:
            text = socket.inet_ntop(fam, raw)
            flags = get_u32(attrs, IFA["IFA_FLAGS"]) or flags
            found.append((ip_interface(f"{text}/{prefixlen}"), flags))
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
    table = table if table is not None else RT_TABLE_MAIN
    attrs: list[Any] = [("RTA_DST", str(dst.network_address))] if dst.prefixlen else []
    attrs += [("RTA_OIF", index), ("RTA_TABLE", table)]
    if gw is not None:
        attrs.append(("RTA_GATEWAY", str(gw)))
    if priority:
        attrs.append(("RTA_PRIORITY", priority))
    metrics = [(k, v) for k, v in (("RTAX_MTU", mtu), ("RTAX_ADVMSS", advmss)) if v]
    if metrics:
        attrs.append(("RTA_METRICS", nested(*metrics)))
    body = encode(
        RouteMsg,
        attrs,
        family=_family(dst.version),
        dst_len=dst.prefixlen,
        table=table if table < 256 else RT_TABLE_MAIN,  # RTA_TABLE carries the real one
        proto=RTPROT_BOOT,
        scope=scope or 0,
        type=RTN_UNICAST,
    )
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
    header: tuple[int, ...]  # RTMSG's fields
    attrs: dict[int, bytes]


def _route_msgs(nl: Rtnl, family: int, table: int) -> list[_RouteMsg]:
    found = []
    for msg in nl.dump(RTM_GETROUTE, encode(RouteMsg, family=family)):
        header = RTMSG.unpack_from(msg, HEADER.size)
        fam, dst_len, header_table = header[0], header[1], header[4]
        attrs = parse_attrs(msg, HEADER.size + RTMSG.size)
        if (get_u32(attrs, RTA["RTA_TABLE"]) or header_table) != table:
            continue
        raw_dst = attrs.get(RTA["RTA_DST"]) or bytes(4 if fam == socket.AF_INET else 16)
        dst = ip_network(f"{socket.inet_ntop(fam, raw_dst)}/{dst_len}", strict=False)
        hops = []
        multipath = attrs.get(RTA["RTA_MULTIPATH"], b"")
        offset = 0
        while offset + NEXTHOP.size <= len(multipath):
            size, _, _, oif = NEXTHOP.unpack_from(multipath, offset)
            if size < NEXTHOP.size:
                break
            hop = parse_attrs(multipath[offset + NEXTHOP.size : offset + size])
            hops.append((_ip(fam, hop.get(RTA["RTA_GATEWAY"])), oif))
            offset += (size + 3) & ~3
        gw = _ip(fam, attrs.get(RTA["RTA_GATEWAY"]))
        oif = get_u32(attrs, RTA["RTA_OIF"]) or 0
        found.append(_RouteMsg(dst, gw, oif, hops, header, attrs))
    return found


def delete_default_routes(nl: Rtnl, family: int, oif: int) -> int:
    """Delete the main table's default routes of `family` through link `oif`; how many."""
    deleted = 0
    for route in _route_msgs(nl, family, RT_TABLE_MAIN):
        if route.dst.prefixlen != 0 or route.oif != oif:
            continue
        # The route's own header and its key attributes, as the dump gave them.
        header = dict(zip((name for name, _ in RouteMsg.fields), route.header, strict=True))
        key: list[Any] = [("RTA_OIF", route.oif)]
        if route.gw is not None:
            key.append(("RTA_GATEWAY", str(route.gw)))
        for name in ("RTA_PRIORITY", "RTA_TABLE"):
            value = get_u32(route.attrs, RTA[name])
            if value is not None:
                key.append((name, value))
        nl.request(RTM_DELROUTE, encode(RouteMsg, key, **header))
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
    with open(_sysctl_path(key)) as f:
        return f.read().strip()


def write_sysctl(key: str, value: str) -> None:
    with open(_sysctl_path(key), "w") as f:
        f.write(value)


def _sysctl_path(key: str) -> str:
    """Under the host's /proc where the call has a root (a daemon's chrootDir): a
    container that is not privileged has its own /proc/sys read-only. A net sysctl file
    belongs to the namespace of the thread that opens it, through any procfs mount."""
    root = callscope.current().root
    if root and not os.path.isdir(f"{root}/proc/sys/net"):
        root = ""  # a root without the host's /proc mounted in it
    return f"{root}/proc/sys/{key}"


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

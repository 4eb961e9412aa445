"""Netlink helpers for the delegate plugins: one small function per kernel operation.

Each helper takes an open pyroute2 `IPRoute` bound to the namespace it should act in
(open it with `netlink()` on a thread that is already in that namespace, e.g. inside
`delegates.netns.run_in_netns`). pyroute2 is imported lazily, so importing this module
costs nothing until a socket is opened. Kernel errors become CNIError(PLUGIN_ERROR), the
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

from cni.errors import CNIError
from cni.result import IPAddress, IPInterface, IPNetwork
from delegates.netns import open_netns

PLUGIN_ERROR = 999
"""libcni's ErrInternal: the reference plugins wrap every error of their own in it."""

IFF_LOWER_UP = 0x10000
IFA_F_DADFAILED = 0x08
IFA_F_TENTATIVE = 0x40
RT_TABLE_MAIN = 254
RTPROT_BOOT = 3  # what vishvananda/netlink (and so the reference plugins) stamps on routes


def fail(msg: str, details: str = "") -> CNIError:
    """A plugin failure as the reference reports it (code 999)."""
    return CNIError(PLUGIN_ERROR, msg, details)


def errno_of(exc: BaseException) -> int | None:
    """The errno behind a pyroute2 NetlinkError or an OSError, else None."""
    code = getattr(exc, "code", None) if type(exc).__name__ == "NetlinkError" else None
    if code is None and isinstance(exc, OSError):
        code = exc.errno
    return code if isinstance(code, int) else None


def describe(exc: BaseException) -> str:
    """A kernel error as Go's syscall.Errno prints it ("no such device")."""
    code = errno_of(exc)
    text = os.strerror(code) if code else str(exc)
    return text[:1].lower() + text[1:]


@contextmanager
def netlink() -> Iterator[Any]:
    """An rtnetlink socket in the calling thread's network namespace."""
    from pyroute2 import IPRoute

    ipr = IPRoute(groups=0)  # no multicast: we only want replies to our requests
    try:
        yield ipr
    finally:
        ipr.close()


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
    mode: str | int | None  # IFLA_MACVLAN_MODE name / IFLA_IPVLAN_MODE number

    @property
    def carrier(self) -> bool:
        return bool(self.flags & IFF_LOWER_UP)


def _link(msg: Any) -> Link:
    info = msg.get_attr("IFLA_LINKINFO")
    kind, data = "", None
    if info is not None:
        kind = info.get_attr("IFLA_INFO_KIND") or ""
        data = info.get_attr("IFLA_INFO_DATA")
    mode = None
    if data is not None and not isinstance(data, (str, bytes)):
        mode = data.get_attr("IFLA_MACVLAN_MODE")
        if mode is None:
            mode = data.get_attr("IFLA_IPVLAN_MODE")
    return Link(
        index=int(msg["index"]),
        name=msg.get_attr("IFLA_IFNAME") or "",
        kind=kind,
        mtu=int(msg.get_attr("IFLA_MTU") or 0),
        mac=(msg.get_attr("IFLA_ADDRESS") or "").lower(),
        flags=int(msg["flags"]),
        mode=mode,
    )


def find_link(ipr: Any, name: str = "", index: int = 0) -> Link | None:
    """The link called `name` (or with `index`), or None if there is none."""
    try:
        msgs = ipr.link("get", index=index) if index else ipr.link("get", ifname=name)
    except Exception as exc:
        # EINVAL: a name the kernel cannot hold (too long), so no such link either.
        if errno_of(exc) == errno.ENODEV or (not index and errno_of(exc) == errno.EINVAL):
            return None
        raise fail(f"failed to look up link {name or index}: {describe(exc)}") from None
    return _link(msgs[0]) if msgs else None


def default_route_link(ipr: Any) -> str:
    """The interface of the first default route in the main table (IPv4 first)."""
    for family in (socket.AF_INET, socket.AF_INET6):
        for route in ipr.get_routes(family=family, table=RT_TABLE_MAIN):
            oif = route.get_attr("RTA_OIF")
            if route["dst_len"] == 0 and oif:
                link = find_link(ipr, index=oif)
                if link is not None:
                    return link.name
    raise fail("no default route interface found")


def create_child(
    ipr: Any,
    kind: str,
    name: str,
    parent: int,
    mode: Any,
    *,
    netns: int | None = None,
    mtu: int = 0,
    mac: str = "",
) -> None:
    """Create a macvlan/ipvlan `name` on link index `parent`, optionally straight into the
    namespace behind descriptor `netns`. Raises the kernel error unchanged."""
    spec: dict[str, Any] = {"ifname": name, "kind": kind, "link": parent}
    spec[f"{kind}_mode"] = mode
    if netns is not None:
        spec["net_ns_fd"] = netns
    if mtu:
        spec["mtu"] = mtu
    if mac:
        spec["address"] = mac
    ipr.link("add", **spec)


def set_link(ipr: Any, index: int, *, name: str = "", up: bool = False) -> None:
    """Rename and/or bring up link `index` in one message (the rename happens first)."""
    spec: dict[str, Any] = {"index": index}
    if name:
        spec["ifname"] = name
    if up:
        spec["state"] = "up"
    ipr.link("set", **spec)


def delete_link(ipr: Any, name: str = "", index: int = 0) -> bool:
    """Delete the link with `index` (or called `name`); False if it did not exist."""
    if not index:
        link = find_link(ipr, name)
        if link is None:
            return False
        index = link.index
    try:
        ipr.link("del", index=index)
    except Exception as exc:
        if errno_of(exc) == errno.ENODEV:
            return False
        raise fail(f"failed to delete link {name or index}: {describe(exc)}") from None
    return True


def add_address(ipr: Any, index: int, address: IPInterface) -> None:
    """Add an address; IPv4 gets a broadcast address below /31, as vishvananda/netlink."""
    spec: dict[str, Any] = {
        "index": index,
        "address": str(address.ip),
        "prefixlen": address.network.prefixlen,
    }
    if isinstance(address, IPv4Interface) and address.network.prefixlen < 31:
        spec["broadcast"] = str(address.network.broadcast_address)
    ipr.addr("add", **spec)


def addresses(
    ipr: Any, index: int, family: int = socket.AF_UNSPEC
) -> list[tuple[IPInterface, int]]:
    """(address, IFA flags) of every address on link `index`."""
    found = []
    for msg in ipr.get_addr(family=family, index=index):
        flags = msg.get_attr("IFA_FLAGS")
        text = msg.get_attr("IFA_ADDRESS") or msg.get_attr("IFA_LOCAL")
        if text:
            found.append((ip_interface(f"{text}/{msg['prefixlen']}"), int(flags or msg["flags"])))
    return found


def add_route(
    ipr: Any,
    index: int,
    dst: IPNetwork,
    gw: IPAddress | None,
    *,
    mtu: int | None = None,
    advmss: int | None = None,
    priority: int | None = None,
    table: int | None = None,
    scope: int | None = None,
) -> None:
    """Add a route through link `index` like netlink.RouteAddEcmp (no NLM_F_EXCL)."""
    spec: dict[str, Any] = {
        "dst": str(dst),
        "oif": index,
        "proto": RTPROT_BOOT,
        "scope": scope or 0,
        "table": table if table is not None else RT_TABLE_MAIN,
    }
    if dst.version == 6:
        spec["family"] = socket.AF_INET6
    if gw is not None:
        spec["gateway"] = str(gw)
    if priority:
        spec["priority"] = priority
    metrics = {k: v for k, v in (("RTAX_MTU", mtu), ("RTAX_ADVMSS", advmss)) if v}
    if metrics:
        spec["metrics"] = {"attrs": list(metrics.items())}
    ipr.route("append", **spec)


@dataclass(frozen=True)
class RouteEntry:
    """One route of a dump, reduced to what CHECK compares."""

    dst: IPNetwork
    gw: IPAddress | None
    oif: int


def routes(ipr: Any, family: int, table: int = RT_TABLE_MAIN) -> list[RouteEntry]:
    """Every route of `family` in `table` (multipath routes: one entry per hop)."""
    zero = "0.0.0.0" if family == socket.AF_INET else "::"
    found = []
    for msg in ipr.get_routes(family=family, table=table):
        dst = ip_network(f"{msg.get_attr('RTA_DST') or zero}/{msg['dst_len']}", strict=False)
        hops = msg.get_attr("RTA_MULTIPATH")
        if hops:
            for hop in hops:
                gw = hop.get_attr("RTA_GATEWAY")
                found.append(RouteEntry(dst, ip_address(gw) if gw else None, hop["oif"]))
            continue
        gw = msg.get_attr("RTA_GATEWAY")
        found.append(RouteEntry(dst, ip_address(gw) if gw else None, msg.get_attr("RTA_OIF") or 0))
    return found


def read_sysctl(key: str) -> str:
    """A sysctl of the calling thread's network namespace ("net/ipv4/conf/eth0/...")."""
    with open("/proc/sys/" + key) as f:
        return f.read().strip()


def write_sysctl(key: str, value: str) -> None:
    with open("/proc/sys/" + key, "w") as f:
        f.write(value)


def settle_addresses(ipr: Any, index: int, timeout: float = 10.0) -> bool:
    """Wait until no IPv6 address of link `index` is tentative; False on timeout."""
    deadline = time.monotonic() + timeout
    while True:
        flags = [f for _, f in addresses(ipr, index, socket.AF_INET6)]
        if not any(f & (IFA_F_TENTATIVE | IFA_F_DADFAILED) for f in flags):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)

"""Apply an IPAM result to an interface inside the pod namespace, and verify it for CHECK.

`configure_iface` does what the reference's ipam.ConfigureIface (plugins 1.1.1) does:
bring the link up, enable IPv6 where an IPv6 address goes, add every address whose
`interface` index names this link, wait for IPv6 DAD when there is an IPv6 gateway, then
add each route, defaulting its gateway to the first gateway of its family. All functions
run on a thread inside the pod namespace with an Rtnl (delegates.rtnl) opened there.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Sequence

from cni.result import DNS, Interface, IPAddress, IPConfig, Result, Route
from delegates.link import (
    Link,
    add_address,
    add_route,
    addresses,
    describe,
    fail,
    find_link,
    read_sysctl,
    routes,
    set_link,
    settle_addresses,
    write_sysctl,
)
from delegates.rtnl import Rtnl

SETTLE_SECONDS = 10.0
log = logging.getLogger("plexus.delegates")


def attached_result(iface: Interface, dns: DNS, ipc: Result | None) -> Result:
    """The ADD result for one pod interface: its IPs (pointing at it) and routes from IPAM."""
    result = Result(interfaces=[iface], dns=dns)
    if ipc is not None:
        result.ips = [ip.model_copy(update={"interface": 0}) for ip in ipc.ips]
        result.routes = list(ipc.routes)
    return result


def configure_pod_iface(nl: Rtnl, link: Link, netns: str, ipc: Result | None) -> Interface:
    """The pod interface for the result; with IPAM, its sysctls, addresses and routes set."""
    iface = Interface(name=link.name, mac=link.mac, mtu=link.mtu, sandbox=netns)
    if ipc is not None:
        ips = [ip.model_copy(update={"interface": 0}) for ip in ipc.ips]
        set_notify_sysctls(link.name, ips)
        full = Result(interfaces=[iface], ips=ips, routes=ipc.routes)
        configure_iface(nl, link, full, is_up=True)
    return iface


def set_notify_sysctls(ifname: str, ips: Sequence[IPConfig]) -> None:
    """arp_notify=1 (as the reference), and ndisc_notify=1 when an IPv6 address goes on.

    Best effort, like the reference: a missing sysctl (IPv6 disabled) is not an error.
    """
    keys = [f"net/ipv4/conf/{ifname}/arp_notify"]
    if any(ipc.address.version == 6 for ipc in ips):
        keys.append(f"net/ipv6/conf/{ifname}/ndisc_notify")
    for key in keys:
        with contextlib.suppress(OSError):
            write_sysctl(key, "1")


def _enable_ipv6(ifname: str) -> None:
    for iface in ("lo", ifname):
        key = f"net/ipv6/conf/{iface}/disable_ipv6"
        try:
            value = read_sysctl(key)
        except OSError as exc:
            log.warning("failed to read sysctl %s: %s", key, exc)
            continue
        if value == "0":
            continue
        try:
            write_sysctl(key, "0")
        except OSError as exc:
            raise fail(
                f'failed to enable IPv6 for interface "{iface}" ({key}={value}): {describe(exc)}'
            ) from None


def default_gateways(result: Result, ifname: str) -> dict[int, IPAddress]:
    """The first gateway of each family among the addresses for `ifname`."""
    gws: dict[int, IPAddress] = {}
    for ipc in _own_ips(result, ifname):
        if ipc.gateway is not None:
            gws.setdefault(ipc.gateway.version, ipc.gateway)
    return gws


def _own_ips(result: Result, ifname: str) -> list[IPConfig]:
    own = []
    for ipc in result.ips:
        if ipc.interface is None:
            continue
        idx = ipc.interface
        if idx < 0 or idx >= len(result.interfaces) or result.interfaces[idx].name != ifname:
            raise fail(
                f'failed to add IP addr {ipc.address} to "{ifname}": invalid interface index'
            )
        own.append(ipc)
    return own


def configure_iface(nl: Rtnl, link: Link, result: Result, *, is_up: bool = False) -> None:
    """Put `result`'s addresses and routes on `link` (already named as in the result)."""
    ifname = link.name
    if not result.interfaces:
        raise fail("no interfaces to configure")
    if not is_up:
        try:
            set_link(nl, link.index, up=True)
        except Exception as exc:
            raise fail(f'failed to set "{ifname}" UP: {describe(exc)}') from None
    own = _own_ips(result, ifname)
    if any(ipc.address.version == 6 for ipc in own):
        _enable_ipv6(ifname)
    for ipc in own:
        try:
            add_address(nl, link.index, ipc.address)
        except Exception as exc:
            raise fail(
                f'failed to add IP addr {ipc.address} to "{ifname}": {describe(exc)}'
            ) from None
    gws = default_gateways(result, ifname)
    if 6 in gws:
        # Like the reference, wait (best effort) for IPv6 DAD to finish; without a carrier
        # DAD cannot progress, so do not wait for nothing.
        current = find_link(nl, index=link.index)
        if current is not None and current.carrier:
            settle_addresses(nl, link.index, SETTLE_SECONDS)
    for route in result.routes:
        gw = route.gw if route.gw is not None else gws.get(route.dst.version)
        try:
            add_route(
                nl,
                link.index,
                route.dst,
                gw,
                mtu=route.mtu,
                advmss=route.advmss,
                priority=route.priority,
                table=route.table,
                scope=route.scope,
            )
        except Exception as exc:
            raise fail(
                f"failed to add route '{route.dst} via {gw} dev {ifname}': {describe(exc)}"
            ) from None


def verify_ips(nl: Rtnl, link: Link, ips: Sequence[IPConfig]) -> None:
    """CHECK: every address is on the link and its subnet route is in the main table."""
    present = {addr for addr, _ in addresses(nl, link.index)}
    subnets = {
        4: {r.dst for r in routes(nl, socket.AF_INET)},
        6: {r.dst for r in routes(nl, socket.AF_INET6)},
    }
    for ipc in ips:
        if ipc.address not in present:
            raise fail(f"Failed to match addr {ipc.address} on interface {link.name}")
        if ipc.address.network not in subnets[ipc.address.version]:
            raise fail(f"Failed to find Gateway {ipc.gateway} for interface {link.name}")


def verify_routes(nl: Rtnl, result: Result, ifname: str) -> None:
    """CHECK: every route of the result is in its table.

    A default route matches on destination alone (as the reference). Other routes must
    have the gateway ADD gave them: their own, or the first gateway of their family.
    """
    gws = default_gateways(result, ifname)
    tables: dict[tuple[int, int], list[tuple[object, object]]] = {}
    for route in result.routes:
        family = socket.AF_INET if route.dst.version == 4 else socket.AF_INET6
        key = (family, route.table or 254)
        if key not in tables:
            tables[key] = [(r.dst, r.gw) for r in routes(nl, *key)]
        if not _route_present(route, gws, tables[key]):
            gw = route.gw if route.gw is not None else gws.get(route.dst.version)
            raise fail(f"Expected Route {route.dst} via {gw} not found in routing table")


def _route_present(
    route: Route, gws: dict[int, IPAddress], installed: list[tuple[object, object]]
) -> bool:
    if route.dst.prefixlen == 0:
        return any(dst == route.dst for dst, _ in installed)
    want = route.gw if route.gw is not None else gws.get(route.dst.version)
    return (route.dst, want) in installed

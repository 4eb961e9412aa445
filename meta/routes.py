"""The `default-route` selection field: one default gateway per family, chosen by the pod.

When any network asks for the default route of a family, every other network's
default route of that family is removed, in the netns and in its cached result.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cni.errors import CNIError, ErrorCode
from cni.result import Result, Route
from delegates.netns import run_in_netns
from meta.delegate import Delegate

if TYPE_CHECKING:
    from delegates.rtnl import Rtnl

_DEFAULT = {4: ipaddress.ip_network("0.0.0.0/0"), 6: ipaddress.ip_network("::/0")}
_FAMILY = {4: socket.AF_INET, 6: socket.AF_INET6}


@dataclass(frozen=True)
class RoutePlan:
    """What to change: families to strip per interface, gateways to set per interface."""

    strip: dict[str, set[int]]
    gateways: dict[str, list[str]]

    @property
    def empty(self) -> bool:
        return not self.strip and not self.gateways


def plan_default_routes(delegates: Sequence[Delegate]) -> RoutePlan:
    """Validate the requests (at most one gateway per family) and plan the changes."""
    requested: dict[int, str] = {}
    for delegate in delegates:
        for gw in delegate.gateway_request:
            version = ipaddress.ip_address(gw).version
            if version in requested:
                raise CNIError(
                    ErrorCode.INVALID_CONFIG,
                    f"default-route: more than one IPv{version} gateway requested "
                    f"({requested[version]} and {gw} on {delegate.network}); ECMP is not supported",
                )
            requested[version] = gw
    strip: dict[str, set[int]] = {}
    gateways: dict[str, list[str]] = {}
    for delegate in delegates:
        own = {ipaddress.ip_address(gw).version for gw in delegate.gateway_request}
        families = set(requested) - own
        if families:
            strip[delegate.ifname] = families
        if delegate.gateway_request:
            gateways[delegate.ifname] = list(delegate.gateway_request)
    return RoutePlan(strip=strip, gateways=gateways)


def apply_to_netns(netns: str, plan: RoutePlan) -> None:
    """Remove and add default routes inside the pod's namespace."""
    if plan.empty:
        return
    run_in_netns(netns, lambda: _apply(plan))


def _apply(plan: RoutePlan) -> None:
    from delegates import link  # netlink (pyroute2: ~1.8 MiB) loads with its first use

    with link.netlink() as nl:
        for ifname, families in plan.strip.items():
            index = _link_index(nl, ifname)
            for version in families:
                link.delete_default_routes(nl, _FAMILY[version], index)
        for ifname, gws in plan.gateways.items():
            index = _link_index(nl, ifname)
            for gw in gws:
                address = ipaddress.ip_address(gw)
                link.add_route(nl, index, _DEFAULT[address.version], address, replace=True)


def _link_index(nl: Rtnl, ifname: str) -> int:
    from delegates import link

    found = link.find_link(nl, ifname)
    if found is None:
        raise CNIError(ErrorCode.IO_FAILURE, f"default-route: interface {ifname} not found in pod")
    return found.index


def apply_to_result(result: Result, ifname: str, plan: RoutePlan) -> Result:
    """The result as the namespace now is: default routes stripped or set for `ifname`."""
    strip = plan.strip.get(ifname, set())
    routes = [r for r in result.routes if not (r.dst.prefixlen == 0 and r.dst.version in strip)]
    for gw in plan.gateways.get(ifname, []):
        address = ipaddress.ip_address(gw)
        routes = [
            r for r in routes if not (r.dst.prefixlen == 0 and r.dst.version == address.version)
        ]
        routes.append(Route(dst=_DEFAULT[address.version], gw=address))
    return result.model_copy(update={"routes": routes})

"""The `k8s.v1.cni.cncf.io/network-status` pod annotation, built from CNI results as Multus does.

`network_statuses` follows Multus's `CreateNetworkStatuses`: a result with exactly one
interface gives one entry holding every IP; otherwise there is one entry per interface
that has a `sandbox`, and IPs go to the entry of their `interface` index (IPs without
an index go to the last entry). `render` prints the list the way Multus's Go code does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from cni.result import Result

NETWORK_STATUS_ANNOTATION = "k8s.v1.cni.cncf.io/network-status"

# Go's encoding/json escapes these even inside strings.
_GO_ESCAPES = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


class NetworkStatus(BaseModel):
    """One entry of the annotation: a pod interface attached to a network."""

    model_config = ConfigDict(populate_by_name=True)

    name: str
    interface: str | None = None
    ips: list[str] = Field(default_factory=list)
    mac: str | None = None
    mtu: int | None = None
    default: bool = False
    dns: dict[str, Any] = Field(default_factory=dict)
    gateway: list[str] | None = None
    device_info: dict[str, Any] | None = Field(default=None, alias="device-info")

    def to_multus(self) -> dict[str, Any]:
        """The JSON object Multus writes: its field order, empty fields left out except `dns`."""
        out: dict[str, Any] = {"name": self.name}
        if self.interface:
            out["interface"] = self.interface
        if self.ips:
            out["ips"] = self.ips
        if self.mac:
            out["mac"] = self.mac
        if self.mtu:
            out["mtu"] = self.mtu
        if self.default:
            out["default"] = True
        out["dns"] = self.dns
        if self.device_info is not None:
            out["device-info"] = self.device_info
        if self.gateway:
            out["gateway"] = self.gateway
        return out


def render(statuses: Sequence[NetworkStatus]) -> str:
    """The annotation value: each entry indented by 4 as Go's MarshalIndent, joined by `,`."""
    return "[" + ",".join(_go_json(status.to_multus()) for status in statuses) + "]"


def _go_json(value: Any) -> str:
    text = json.dumps(value, indent=4, ensure_ascii=False)
    for char, escape in _GO_ESCAPES:
        text = text.replace(char, escape)
    return text


def network_statuses(
    result: Result,
    network_name: str,
    default: bool,
    device_info: Mapping[str, Any] | None = None,
) -> list[NetworkStatus]:
    """Status entries for one delegate's CNI result."""
    common: dict[str, Any] = {
        "name": network_name,
        "dns": {key: value for key, value in result.dns.model_dump().items() if value},
        "gateway": [str(r.gw) for r in result.routes if r.gw is not None and r.dst.prefixlen == 0]
        or None,
        "device_info": None if device_info is None else dict(device_info),
    }
    if len(result.interfaces) == 1:
        iface = result.interfaces[0]
        if iface.sandbox:
            common.update(interface=iface.name, mac=iface.mac or None, mtu=iface.mtu or None)
        return [NetworkStatus(ips=result.ip_strings(), default=default, **common)]
    return _per_interface(result, default, common)


def _per_interface(result: Result, default: bool, common: dict[str, Any]) -> list[NetworkStatus]:
    """One entry per sandbox interface; the default one is the gateway's, else the first."""
    pod_side = [i for i, iface in enumerate(result.interfaces) if iface.sandbox]
    if not pod_side:
        return []
    ips: dict[int, list[str]] = {index: [] for index in pod_side}
    for ip in result.ips:
        target = pod_side[-1] if ip.interface is None else ip.interface
        if target in ips:
            ips[target].append(str(ip.address.ip))
    default_index = None
    if default:
        gateway_ips = (
            ip.interface for ip in result.ips if ip.gateway is not None and ip.interface is not None
        )
        default_index = next(gateway_ips, pod_side[0])
    return [
        NetworkStatus(
            interface=result.interfaces[index].name,
            mac=result.interfaces[index].mac or None,
            mtu=result.interfaces[index].mtu or None,
            ips=ips[index],
            default=index == default_index,
            **common,
        )
        for index in pod_side
    ]

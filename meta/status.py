"""The `k8s.v1.cni.cncf.io/network-status` pod annotation, built from CNI results as Multus does.

`network_statuses` follows Multus's `CreateNetworkStatuses`: a result with exactly one
interface gives one entry holding every IP; otherwise there is one entry per interface
that has a `sandbox`, and IPs go to the entry of their `interface` index (IPs without
an index go to the last entry). `render` prints the list the way Multus's Go code does.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from cni.errors import CNIError, ErrorCode

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


class _Absent(BaseModel):
    """Result element where JSON `null` means absent, as when Go decodes it."""

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            return {key: value for key, value in data.items() if value is not None}
        return data


class _Interface(_Absent):
    name: str
    mac: str = ""
    mtu: int | None = None
    sandbox: str = ""


class _IPConfig(_Absent):
    address: str
    gateway: str | None = None
    interface: int | None = None

    @field_validator("address")
    @classmethod
    def _bare_ip(cls, value: str) -> str:
        return str(ipaddress.ip_interface(value).ip)


class _Route(_Absent):
    dst: str
    gw: str | None = None

    @property
    def is_default(self) -> bool:
        return ipaddress.ip_network(self.dst, strict=False).prefixlen == 0

    @field_validator("dst")
    @classmethod
    def _network(cls, value: str) -> str:
        ipaddress.ip_network(value, strict=False)
        return value

    @field_validator("gw")
    @classmethod
    def _canonical_ip(cls, value: str | None) -> str | None:
        return None if value is None else str(ipaddress.ip_address(value))


class _DNS(_Absent):
    nameservers: list[str] = Field(default_factory=list)
    domain: str = ""
    search: list[str] = Field(default_factory=list)
    options: list[str] = Field(default_factory=list)


class _Result(_Absent):
    interfaces: list[_Interface] = Field(default_factory=list)
    ips: list[_IPConfig] = Field(default_factory=list)
    routes: list[_Route] = Field(default_factory=list)
    dns: _DNS = Field(default_factory=_DNS)


def network_statuses(
    result: Mapping[str, Any],
    network_name: str,
    default: bool,
    device_info: Mapping[str, Any] | None = None,
) -> list[NetworkStatus]:
    """Status entries for one delegate's CNI result (1.0.0/1.1.0 form)."""
    try:
        parsed = _Result.model_validate(dict(result))
    except ValidationError as exc:
        error = exc.errors(include_url=False)[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        raise CNIError(
            ErrorCode.DECODE_FAILURE, f'result of network "{network_name}": {where[1:]}: {message}'
        ) from exc
    common: dict[str, Any] = {
        "name": network_name,
        "dns": {key: value for key, value in parsed.dns.model_dump().items() if value},
        "gateway": [r.gw for r in parsed.routes if r.gw and r.is_default] or None,
        "device_info": None if device_info is None else dict(device_info),
    }
    if len(parsed.interfaces) == 1:
        iface = parsed.interfaces[0]
        if iface.sandbox:
            common.update(interface=iface.name, mac=iface.mac or None, mtu=iface.mtu or None)
        return [NetworkStatus(ips=[ip.address for ip in parsed.ips], default=default, **common)]
    return _per_interface(parsed, default, common)


def _per_interface(parsed: _Result, default: bool, common: dict[str, Any]) -> list[NetworkStatus]:
    """One entry per sandbox interface; the default one is the gateway's, else the first."""
    pod_side = [i for i, iface in enumerate(parsed.interfaces) if iface.sandbox]
    if not pod_side:
        return []
    ips: dict[int, list[str]] = {index: [] for index in pod_side}
    for ip in parsed.ips:
        target = pod_side[-1] if ip.interface is None else ip.interface
        if target in ips:
            ips[target].append(ip.address)
    default_index = None
    if default:
        gateway_ips = (ip.interface for ip in parsed.ips if ip.gateway and ip.interface is not None)
        default_index = next(gateway_ips, pod_side[0])
    return [
        NetworkStatus(
            interface=parsed.interfaces[index].name,
            mac=parsed.interfaces[index].mac or None,
            mtu=parsed.interfaces[index].mtu or None,
            ips=ips[index],
            default=index == default_index,
            **common,
        )
        for index in pod_side
    ]

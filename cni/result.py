"""CNI results: one internal model (the 1.1.0 superset) read from and written as any version.

The wire forms follow libcni: 0.1.0/0.2.0 use `ip4`/`ip6`; 0.3.x/0.4.0 add `interfaces`,
`ips[].version` and top-level `routes`; 1.0.0 drops `ips[].version`; 1.1.0 adds interface
`mtu`/`socketPath`/`pciID` and route `mtu`/`advmss`/`priority`/`table`/`scope`.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import IntEnum
from ipaddress import (
    IPv4Address,
    IPv4Interface,
    IPv4Network,
    IPv6Address,
    IPv6Interface,
    IPv6Network,
    ip_network,
)
from typing import Annotated, Any

from pydantic import BeforeValidator, Field, ValidationError, model_validator

from cni.errors import CNIError, ErrorCode
from cni.models import WireModel, validation_details
from cni.version import (
    CURRENT_VERSION,
    DEFAULT_VERSION,
    SUPPORTED_VERSIONS,
    is_supported,
    parse_version,
)


def _lenient_network(value: Any) -> Any:
    """Accept "10.1.2.3/24" like Go's ParseCIDR (host bits are masked off)."""
    return ip_network(value, strict=False) if isinstance(value, str) else value


IPAddress = IPv4Address | IPv6Address
IPInterface = IPv4Interface | IPv6Interface
IPNetwork = Annotated[IPv4Network | IPv6Network, BeforeValidator(_lenient_network)]


class _ResultModel(WireModel):
    """A result object as libcni decodes it: a JSON `null` is an absent field (Go leaves
    the zero value), so a plugin may print `"routes": null` or `"mac": null`."""

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            return {key: value for key, value in data.items() if value is not None}
        return data


class _Form(IntEnum):
    """Result wire layouts, oldest first."""

    LEGACY = 0  # 0.1.0, 0.2.0
    IP_VERSION = 1  # 0.3.0, 0.3.1, 0.4.0
    V1_0 = 2
    V1_1 = 3


def _form(version: str) -> _Form:
    if not is_supported(version):
        raise CNIError(
            ErrorCode.INCOMPATIBLE_VERSION,
            f"unsupported CNI result version {version!r}",
            f"supported versions are {list(SUPPORTED_VERSIONS)}",
        )
    major, minor, _ = parse_version(version)
    if major == 0:
        return _Form.LEGACY if minor <= 2 else _Form.IP_VERSION
    return _Form.V1_0 if minor == 0 else _Form.V1_1


class Interface(_ResultModel):
    """An interface created by a plugin."""

    name: str
    mac: str = ""
    mtu: int | None = None
    sandbox: str = ""
    socket_path: str = Field(default="", alias="socketPath")
    pci_id: str = Field(default="", alias="pciID")

    def _wire(self, form: _Form) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.mac:
            out["mac"] = self.mac
        if form >= _Form.V1_1 and self.mtu:
            out["mtu"] = self.mtu
        if self.sandbox:
            out["sandbox"] = self.sandbox
        if form >= _Form.V1_1:
            if self.socket_path:
                out["socketPath"] = self.socket_path
            if self.pci_id:
                out["pciID"] = self.pci_id
        return out

    def _as(self, form: _Form) -> Interface:
        """What reading `_wire(form)` back gives."""
        if form >= _Form.V1_1:
            return self.model_copy(update={"mtu": self.mtu or None})
        return self.model_copy(update={"mtu": None, "socket_path": "", "pci_id": ""})


class IPConfig(_ResultModel):
    """An address assigned to an interface (`interface` indexes `Result.interfaces`)."""

    address: IPInterface
    gateway: IPAddress | None = None
    interface: int | None = None

    def _wire(self, form: _Form) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if form == _Form.IP_VERSION:
            out["version"] = str(self.address.version)
        if self.interface is not None:
            out["interface"] = self.interface
        out["address"] = str(self.address)
        if self.gateway is not None:
            out["gateway"] = str(self.gateway)
        return out


class Route(_ResultModel):
    """A route; the 1.1.0 attributes are dropped when writing older versions."""

    dst: IPNetwork
    gw: IPAddress | None = None
    mtu: int | None = None
    advmss: int | None = None
    priority: int | None = None
    table: int | None = None
    scope: int | None = None

    def _wire(self, form: _Form) -> dict[str, Any]:
        out: dict[str, Any] = {"dst": str(self.dst)}
        if self.gw is not None:
            out["gw"] = str(self.gw)
        if form >= _Form.V1_1:
            # libcni omits a zero mtu/advmss/priority but keeps a zero table/scope.
            for key in ("mtu", "advmss", "priority"):
                if getattr(self, key):
                    out[key] = getattr(self, key)
            for key in ("table", "scope"):
                if getattr(self, key) is not None:
                    out[key] = getattr(self, key)
        return out

    def _as(self, form: _Form) -> Route:
        """What reading `_wire(form)` back gives."""
        if form >= _Form.V1_1:
            kept = {k: getattr(self, k) or None for k in ("mtu", "advmss", "priority")}
            return self.model_copy(update=kept)
        return self.model_copy(
            update={"mtu": None, "advmss": None, "priority": None, "table": None, "scope": None}
        )


class DNS(_ResultModel):
    """DNS settings; every field is optional."""

    nameservers: list[str] = Field(default_factory=list)
    domain: str = ""
    search: list[str] = Field(default_factory=list)
    options: list[str] = Field(default_factory=list)

    def _wire(self) -> dict[str, Any]:
        fields = {
            "nameservers": self.nameservers,
            "domain": self.domain,
            "search": self.search,
            "options": self.options,
        }
        return {k: v for k, v in fields.items() if v}

    def _copy(self) -> DNS:
        return DNS.model_construct(
            nameservers=list(self.nameservers),
            domain=self.domain,
            search=list(self.search),
            options=list(self.options),
        )


class _LegacyIP(_ResultModel):
    ip: IPInterface
    gateway: IPAddress | None = None
    routes: list[Route] = Field(default_factory=list)


class _LegacyResult(_ResultModel):
    ip4: _LegacyIP | None = None
    ip6: _LegacyIP | None = None
    dns: DNS = Field(default_factory=DNS)


class Result(_ResultModel):
    """A plugin result in any CNI version, held as the 1.1.0 superset."""

    cni_version: str = Field(default=CURRENT_VERSION, alias="cniVersion")
    interfaces: list[Interface] = Field(default_factory=list)
    ips: list[IPConfig] = Field(default_factory=list)
    routes: list[Route] = Field(default_factory=list)
    dns: DNS = Field(default_factory=DNS)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Result:
        """Read a result of any supported version (no `cniVersion` means 0.1.0, as libcni).

        Raises CNIError(DECODE_FAILURE) on malformed data and
        CNIError(INCOMPATIBLE_VERSION) for an unknown version.
        """
        if not isinstance(data, Mapping):
            raise CNIError(ErrorCode.DECODE_FAILURE, "CNI result must be a JSON object")
        version = data.get("cniVersion") or DEFAULT_VERSION
        if not isinstance(version, str):
            raise CNIError(ErrorCode.DECODE_FAILURE, "CNI result 'cniVersion' must be a string")
        form = _form(version)
        try:
            if form == _Form.LEGACY:
                return cls._from_legacy(version, _LegacyResult.model_validate(data))
            return cls.model_validate({**data, "cniVersion": version})
        except ValidationError as err:
            raise CNIError(
                ErrorCode.DECODE_FAILURE,
                f"invalid CNI {version} result",
                validation_details(err),
            ) from None

    @classmethod
    def _from_legacy(cls, version: str, legacy: _LegacyResult) -> Result:
        """libcni's 0.2.0 -> 0.3.0 step: `interface` unset, gateways and routes kept."""
        ips: list[IPConfig] = []
        routes: list[Route] = []
        for entry in (legacy.ip4, legacy.ip6):
            if entry is not None:
                ips.append(IPConfig(address=entry.ip, gateway=entry.gateway))
                routes.extend(entry.routes)
        return cls(cni_version=version, ips=ips, routes=routes, dns=legacy.dns)

    def to_dict(self, version: str) -> dict[str, Any]:
        """Serialize as `version`, with exactly the fields that version defines.

        0.1.0/0.2.0 keep only the first IPv4 and first IPv6 address and their routes;
        CNIError(INCOMPATIBLE_VERSION) if there is no address to keep.
        """
        form = _form(version)
        if form == _Form.LEGACY:
            return self._to_legacy(version)
        out: dict[str, Any] = {"cniVersion": version}
        if self.interfaces:
            out["interfaces"] = [i._wire(form) for i in self.interfaces]
        if self.ips:
            out["ips"] = [ip._wire(form) for ip in self.ips]
        if self.routes:
            out["routes"] = [r._wire(form) for r in self.routes]
        out["dns"] = self.dns._wire()
        return out

    def _to_legacy(self, version: str) -> dict[str, Any]:
        out: dict[str, Any] = {"cniVersion": version}
        for family in (4, 6):
            ip = next((c for c in self.ips if c.address.version == family), None)
            if ip is None:
                continue
            entry: dict[str, Any] = {"ip": str(ip.address)}
            if ip.gateway is not None:
                entry["gateway"] = str(ip.gateway)
            routes = [r._wire(_Form.LEGACY) for r in self.routes if r.dst.version == family]
            if routes:
                entry["routes"] = routes
            out[f"ip{family}"] = entry
        if len(out) == 1:
            raise CNIError(
                ErrorCode.INCOMPATIBLE_VERSION,
                f"cannot convert result to CNI {version}: it has no IP addresses",
                "0.1.0/0.2.0 results must carry at least one IP; use cniVersion >= 0.3.0",
            )
        out["dns"] = self.dns._wire()
        return out

    def convert(self, version: str) -> Result:
        """This result as `version` would carry it (fields that version lacks are dropped):
        what from_dict(to_dict(version)) reads, copied field by field for the layouts
        that keep every address (~10x faster than the round trip through validation)."""
        form = _form(version)
        if form == _Form.LEGACY:
            return Result.from_dict(self._to_legacy(version))
        return Result.model_construct(
            cni_version=version,
            interfaces=[i._as(form) for i in self.interfaces],
            ips=[ip.model_copy() for ip in self.ips],
            routes=[r._as(form) for r in self.routes],
            dns=self.dns._copy(),
        )

    def ip_strings(self, interface_index: int | None = None) -> list[str]:
        """Bare addresses (no prefix), optionally only those on interface `interface_index`."""
        return [
            str(c.address.ip)
            for c in self.ips
            if interface_index is None or c.interface == interface_index
        ]

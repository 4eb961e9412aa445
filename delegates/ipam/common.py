"""Pieces shared by the in-process IPAMs: Go-compatible parsing, config models, errors.

The reference plugins decode their config with Go's encoding/json and net.ParseIP /
net.ParseCIDR; the helpers here accept and reject the same inputs and raise the same
messages, so a config behaves identically whichever implementation runs it.

Error codes used by the in-process IPAMs (the reference plugins report 999 for all of them):

- 4 INVALID_ENV: malformed CNI_ARGS (`IP=`, `GATEWAY=`, unknown keys without IgnoreUnknown).
- 5 IO_FAILURE: the data dir, lock or resolv.conf cannot be read or written.
- 7 INVALID_CONFIG: bad config (the offending field is named in `details`), a requested IP
  outside every range or equal to a gateway, a missing prevResult.
- 11 TRY_AGAIN_LATER: the range set is exhausted, a requested IP is held by someone else, or
  this container+ifname already holds an address (all clear up once a DEL releases it).
- 100 CHECK_FAILED: CHECK found the reservation or address missing or different.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from ipaddress import (
    IPv4Address,
    IPv4Interface,
    IPv6Address,
    IPv6Interface,
    ip_address,
    ip_interface,
)
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, PlainValidator, ValidationError, model_validator

from cni.errors import CNIError, ErrorCode
from cni.result import Route
from cni.version import parse_version, select_version

IPAddress = IPv4Address | IPv6Address
IPInterface = IPv4Interface | IPv6Interface
M = TypeVar("M", bound=BaseModel)

CHECK_FAILED = 100
"""Plugin-defined code: CHECK found the address it looked for missing or different."""


def parse_ip(text: str) -> IPAddress | None:
    """Go's net.ParseIP: an IPv4-mapped IPv6 address is IPv4; zones are rejected."""
    if "%" in text:
        return None
    try:
        addr = ip_address(text)
    except ValueError:
        return None
    if isinstance(addr, IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def parse_cidr(text: str) -> IPInterface | None:
    """Go's net.ParseCIDR, keeping the host address: "10.1.2.3/24" -> 10.1.2.3 in /24."""
    addr, sep, prefix = text.partition("/")
    if not sep or not prefix.isascii() or not prefix.isdigit() or "%" in addr:
        return None
    try:
        return ip_interface(f"{addr}/{int(prefix)}")
    except ValueError:
        return None


def go_quote(text: str) -> str:
    """Go's %q for the ASCII strings CNI_ARGS carry."""
    return json.dumps(text)


def _ip_field(value: Any) -> IPAddress:
    if isinstance(value, IPv4Address | IPv6Address):
        return value
    parsed = parse_ip(value) if isinstance(value, str) else None
    if parsed is None:
        raise ValueError(f"invalid IP address: {value}")
    return parsed


def _cidr_field(value: Any) -> IPInterface:
    if isinstance(value, IPv4Interface | IPv6Interface):
        return value
    parsed = parse_cidr(value) if isinstance(value, str) else None
    if parsed is None:
        raise ValueError(f"invalid CIDR address: {value}")
    return parsed


def parse_ip_or_cidr(text: str) -> IPAddress | None:
    """The plugins' own ip.IP: "10.1.2.3" or "10.1.2.3/24" (mask ignored); "" is unset."""
    if not text:
        return None
    if "/" in text:
        cidr = parse_cidr(text)
        parsed = cidr.ip if cidr is not None else None
    else:
        parsed = parse_ip(text)
    if parsed is None:
        raise ValueError(f"invalid IP address {text}")
    return parsed


def _ip_or_cidr_field(value: Any) -> IPAddress | None:
    if value is None or isinstance(value, IPv4Address | IPv6Address):
        return value
    if not isinstance(value, str):
        raise ValueError(f"invalid IP address {value}")
    return parse_ip_or_cidr(value)


GoIP = Annotated[IPAddress, PlainValidator(_ip_field)]
"""A JSON string decoded like Go's net.IP."""
GoCIDR = Annotated[IPInterface, PlainValidator(_cidr_field)]
"""A JSON string decoded like libcni's types.IPNet (host bits kept)."""
RequestedIP = Annotated[IPAddress | None, PlainValidator(_ip_or_cidr_field)]
"""A requested address (`runtimeConfig.ips`, `args.cni.ips`): IP or CIDR; "" is None."""


class ConfModel(BaseModel):
    """Config model decoded like Go: keys match case-insensitively, null means unset."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _go_keys(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        known = [f.alias or name for name, f in cls.model_fields.items()]
        folded = {k.lower(): k for k in known}
        out: dict[str, Any] = {}
        for key, value in data.items():
            text = str(key)
            name = text if text in known else folded.get(text.lower(), text)
            if value is None:
                out.pop(name, None)
            else:
                out[name] = value
        return out


class RouteConf(ConfModel):
    """A route in an IPAM config (`dst`, optional `gw` and the 1.1.0 attributes)."""

    dst: GoCIDR
    gw: GoIP | None = None
    mtu: int | None = None
    advmss: int | None = None
    priority: int | None = None
    table: int | None = None
    scope: int | None = None

    def to_route(self) -> Route:
        return Route(
            dst=self.dst.network,
            gw=self.gw,
            mtu=self.mtu,
            advmss=self.advmss,
            priority=self.priority,
            table=self.table,
            scope=self.scope,
        )


def parse_conf(model: type[M], conf: Mapping[str, Any]) -> M:
    """Validate `conf`; CNIError(INVALID_CONFIG) naming the offending field on failure."""
    try:
        return model.model_validate(conf)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "<root>"
        cause = first.get("ctx", {}).get("error")
        msg = (
            str(cause) if isinstance(cause, ValueError) else f"invalid IPAM config: {first['msg']}"
        )
        raise CNIError(ErrorCode.INVALID_CONFIG, msg, f"field {where}") from None


def conf_version(conf: Mapping[str, Any]) -> str:
    """The config's CNI version (CNIError if none of its versions is supported)."""
    return select_version(conf)


def before(version: str, minimum: str) -> bool:
    """True if `version` is older than `minimum`."""
    return parse_version(version) < parse_version(minimum)


def require_name(conf: Mapping[str, Any]) -> str:
    """The network name, which every plugin needs (skel's "missing network name")."""
    name = conf.get("name")
    if not isinstance(name, str) or not name:
        raise CNIError(ErrorCode.INVALID_CONFIG, "missing network name")
    return name


def check_families(version: str, addresses: Iterable[int]) -> None:
    """0.1.0/0.2.0 results hold one address per family; refuse configs that need more."""
    versions = list(addresses)
    if before(version, "0.3.0") and (versions.count(4) > 1 or versions.count(6) > 1):
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            f"CNI version {version} does not support more than 1 address per family",
        )


def load_env_args(
    pairs: Iterable[tuple[str, str]], fields: Mapping[str, Callable[[str], Any]]
) -> dict[str, Any]:
    """Decode CNI_ARGS like libcni's types.LoadArgs into the keys of `fields`.

    Keys match exactly; unknown keys are an error unless IgnoreUnknown is 1/true.
    """
    values: dict[str, Any] = {}
    unknown: list[str] = []
    ignore = False
    for key, value in pairs:
        pair = f"{key}={value}"
        if "=" in value:
            raise CNIError(ErrorCode.INVALID_ENV, f"ARGS: invalid pair {go_quote(pair)}")
        try:
            if key == "IgnoreUnknown":
                ignore = _go_bool(value)
            elif key in fields:
                values[key] = fields[key](value)
            else:
                unknown.append(pair)
        except ValueError as err:
            raise CNIError(
                ErrorCode.INVALID_ENV, f"ARGS: error parsing value of pair {go_quote(pair)}: {err}"
            ) from None
    if unknown and not ignore:
        listed = " ".join(go_quote(p) for p in unknown)
        raise CNIError(ErrorCode.INVALID_ENV, f"ARGS: unknown args [{listed}]")
    return values


def _go_bool(value: str) -> bool:
    lowered = value.lower()
    if lowered in ("1", "true"):
        return True
    if lowered in ("0", "false"):
        return False
    raise ValueError(f"boolean unmarshal error: invalid input {value}")

"""The static IPAM, in process, behaving like the reference plugin.

Config: `addresses` [{address (CIDR), gateway}], `routes`, `dns`. CNI_ARGS `IP=` (comma
separated CIDRs) adds addresses and `GATEWAY=` (comma separated IPs) sets the gateway of
those CNI_ARGS addresses whose subnet contains it; a non-empty `args.cni.ips` replaces all
addresses, and a non-empty `runtimeConfig.ips` (the `ips` capability) replaces them again.
DEL does nothing. CHECK needs prevResult: every configured address found there must carry
the configured gateway (addresses missing from prevResult are not an error, as upstream).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import Field

from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from cni.result import DNS, IPConfig, Result, Route
from delegates.ipam.common import (
    CHECK_FAILED,
    ConfModel,
    GoIP,
    IPAddress,
    IPInterface,
    RouteConf,
    check_families,
    conf_version,
    load_env_args,
    parse_cidr,
    parse_conf,
    parse_ip,
    require_name,
)


class _Address(ConfModel):
    address: str = ""
    gateway: GoIP | None = None


class StaticIPAM(ConfModel):
    """The `ipam` section."""

    type: str = ""
    routes: list[RouteConf] = Field(default_factory=list)
    addresses: list[_Address] = Field(default_factory=list)
    dns: DNS = Field(default_factory=DNS)


class _IPs(ConfModel):
    ips: list[str] = Field(default_factory=list)


class _Args(ConfModel):
    cni: _IPs = Field(default_factory=_IPs)


class _Net(ConfModel):
    ipam: StaticIPAM | None = None
    runtime_config: _IPs = Field(default_factory=_IPs, alias="runtimeConfig")
    args: _Args = Field(default_factory=_Args)


@dataclass(frozen=True)
class StaticConfig:
    """A validated static config."""

    version: str
    addresses: list[IPConfig]
    routes: list[Route]
    dns: DNS


def _cidr(text: str, what: str, code: int = ErrorCode.INVALID_CONFIG) -> IPInterface:
    parsed = parse_cidr(text)
    if parsed is None:
        msg = f"the '{what}' field is expected to be in CIDR notation, got: '{text}'"
        raise CNIError(code, msg)
    return parsed


def _cidrs(texts: list[str]) -> list[tuple[IPInterface | str, IPAddress | None]]:
    out: list[tuple[IPInterface | str, IPAddress | None]] = []
    for text in texts:
        parsed = parse_cidr(text)
        if parsed is None:
            raise CNIError(
                ErrorCode.INVALID_CONFIG,
                f"an entry in the 'ips' field is NOT in CIDR notation, got: '{text}'",
            )
        out.append((parsed, None))
    return out


def load_config(conf: Mapping[str, Any], args: CmdArgs) -> StaticConfig:
    """Validate the config and CNI_ARGS; CNIError as documented in delegates.ipam.common."""
    require_name(conf)
    version = conf_version(conf)
    net = parse_conf(_Net, conf)
    if net.ipam is None:
        raise CNIError(ErrorCode.INVALID_CONFIG, "IPAM config missing 'ipam' key")
    # Config addresses are parsed last, so a replaced one is never looked at (as upstream).
    entries: list[tuple[IPInterface | str, IPAddress | None]] = [
        (a.address, a.gateway) for a in net.ipam.addresses
    ]
    env = load_env_args(args.args, {"IP": str, "GATEWAY": str})
    items = env["IP"].split(",") if env.get("IP") else []
    extra = [_cidr(s.strip(), "ip", ErrorCode.INVALID_ENV) for s in items]
    gateways: list[IPAddress | None] = [None] * len(extra)
    for item in env["GATEWAY"].split(",") if env.get("GATEWAY") else []:
        gw = parse_ip(item.strip())
        if gw is None:
            raise CNIError(ErrorCode.INVALID_ENV, f"invalid gateway address: {item}")
        gateways = [
            gw if gw.version == a.version and gw in a.network else old
            for a, old in zip(extra, gateways, strict=True)
        ]
    entries += zip(extra, gateways, strict=True)
    if net.args.cni.ips:
        entries = _cidrs(net.args.cni.ips)
    if net.runtime_config.ips:
        entries = _cidrs(net.runtime_config.ips)
    addresses = [
        IPConfig(address=a if not isinstance(a, str) else _cidr(a, "address"), gateway=gw)
        for a, gw in entries
    ]
    check_families(version, (ip.address.version for ip in addresses))
    return StaticConfig(
        version=version,
        addresses=addresses,
        routes=[r.to_route() for r in net.ipam.routes],
        dns=net.ipam.dns,
    )


def add(conf: Mapping[str, Any], args: CmdArgs) -> Result:
    """The configured addresses, routes and DNS as a result."""
    cfg = load_config(conf, args)
    result = Result(cni_version=cfg.version, ips=cfg.addresses, routes=cfg.routes, dns=cfg.dns)
    return result.convert(cfg.version)


def check(conf: Mapping[str, Any], args: CmdArgs) -> None:
    """Every configured address present in prevResult must have the configured gateway."""
    cfg = load_config(conf, args)
    prev = conf.get("prevResult")
    if not prev:
        raise CNIError(ErrorCode.INVALID_CONFIG, "Required prevResult missing")
    result = Result.from_dict(prev)
    for want in cfg.addresses:
        for got in result.ips:
            if got.address.ip != want.address.ip:
                continue
            if want.gateway is not None and want.gateway != got.gateway:
                raise CNIError(
                    CHECK_FAILED,
                    f"static: Failed to match addr {got.address.ip} on interface {args.ifname}",
                )
            break

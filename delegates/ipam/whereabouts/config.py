"""whereabouts' IPAM config: its keys, its flat file and its CNI_ARGS, read as it reads them.

The keys (whereabouts v0.9.4): `range` (a CIDR or `START-END/PREFIX`), `range_start`,
`range_end`, `exclude`, `ipRanges` (more ranges, one address each), `gateway`,
`network_name` (prefixes pool and reservation names), `enable_overlapping_ranges`
(default true), `node_slice_size`, `routes`, `dns`, `addresses` (static ones), and from
CNI_ARGS `IP=` (static CIDRs), `GATEWAY=`, `K8S_POD_NAME`, `K8S_POD_NAMESPACE`. A top-level
`range` becomes the first range, with the top-level `range_start`, `range_end` and
`exclude`. The flat file `whereabouts.d/whereabouts.conf` (a bare `ipam` object) fills
every key the config leaves empty, except `enable_overlapping_ranges`.

In process, what would name host paths or the API client is tenant input and is ignored:
`kubernetes.kubeconfig` (the daemon's own client is used), `configuration_path` (only the
standard flat-file paths under the host's / are read), `log_file`, `log_level`; so is what
only served whereabouts' cluster-wide lock (`leader_*`) and its tests (`sleep_for_race`).
A missing flat file is not an error (whereabouts fails with "config file not found": it
needs the file for its kubeconfig, which the daemon does not).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from ipaddress import ip_interface
from typing import Annotated, Any

from pydantic import Field, PlainValidator

from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from cni.result import DNS, IPConfig, Route
from delegates.ipam.common import (
    ConfModel,
    IPAddress,
    IPInterface,
    RouteConf,
    before,
    conf_version,
    load_env_args,
    parse_conf,
    parse_ip,
    require_name,
)
from delegates.ipam.whereabouts.ranges import (
    IPRange,
    Network,
    parse_cidr_sloppy,
    parse_ip_sloppy,
)

IPAM_TYPE = "whereabouts"
FLAT_FILES = (
    "/etc/kubernetes/cni/net.d/whereabouts.d/whereabouts.conf",
    "/etc/cni/net.d/whereabouts.d/whereabouts.conf",
    "/host/etc/cni/net.d/whereabouts.d/whereabouts.conf",
)
"""Where whereabouts looks for its flat file, in order (the first that exists wins); read
under the host's / (the daemon's chrootDir)."""


def _go_ip(value: Any) -> IPAddress | None:
    """A JSON string decoded into Go's net.IP: "" is unset, anything else must parse."""
    if value is None or value == "":
        return None
    parsed = parse_ip(value) if isinstance(value, str) else None
    if parsed is None:
        raise ValueError(f"invalid IP address: {value}")
    return parsed


NetIP = Annotated[IPAddress | None, PlainValidator(_go_ip)]


class _RangeConf(ConfModel):
    range: str = ""
    range_start: NetIP = None
    range_end: NetIP = None
    exclude: list[str] = Field(default_factory=list)


class _Address(ConfModel):
    address: str = ""
    gateway: NetIP = None


class _DNSConf(ConfModel):
    nameservers: list[str] = Field(default_factory=list)
    domain: str = ""
    search: list[str] = Field(default_factory=list)
    options: list[str] = Field(default_factory=list)


class _Kubernetes(ConfModel):
    kubeconfig: str = ""
    k8s_api_root: str = ""


class WhereaboutsIPAM(ConfModel):
    """The `ipam` object (or the flat file's), with whereabouts' zero values as defaults."""

    type: str = ""
    routes: list[RouteConf] = Field(default_factory=list)
    addresses: list[_Address] = Field(default_factory=list)
    ip_ranges: list[_RangeConf] = Field(default_factory=list, alias="ipRanges")
    exclude: list[str] = Field(default_factory=list)
    dns: _DNSConf = Field(default_factory=_DNSConf)
    range: str = ""
    node_slice_size: str = ""
    range_start: str = ""
    range_end: str = ""
    gateway: str = ""
    enable_overlapping_ranges: bool | None = None
    network_name: str = ""
    # Accepted and ignored in process (module docstring).
    kubernetes: _Kubernetes = Field(default_factory=_Kubernetes)
    configuration_path: str = ""
    log_file: str = ""
    log_level: str = ""
    leader_lease_duration: int = 0
    leader_renew_deadline: int = 0
    leader_retry_period: int = 0
    reconciler_cron_expression: str = ""
    sleep_for_race: int = 0
    datastore: str = ""


class _Net(ConfModel):
    ipam: WhereaboutsIPAM | None = None


@dataclass(frozen=True)
class WhereaboutsConfig:
    """A validated config: what a network's every call shares."""

    name: str
    version: str
    ranges: tuple[IPRange, ...]
    gateway: IPAddress | None
    network_name: str
    overlapping: bool
    node_slice_size: str
    routes: tuple[Route, ...]
    dns: DNS
    addresses: tuple[IPConfig, ...]
    """Static addresses: the config's `addresses`, then CNI_ARGS `IP=` (load_config)."""
    pod_namespace: str = ""
    pod_name: str = ""

    @property
    def podref(self) -> str:
        """The allocation's owner as whereabouts writes it: `namespace/name`."""
        return f"{self.pod_namespace}/{self.pod_name}"


def load_config(conf: Mapping[str, Any], args: CmdArgs, root: str = "") -> WhereaboutsConfig:
    """The config of one call: `conf` merged with the flat file under `root`, then CNI_ARGS;
    CNIError(INVALID_CONFIG or INVALID_ENV) naming the bad value."""
    flat = _flat_file(root)
    static = _from_conf(json.dumps(conf, sort_keys=True), flat)
    env = load_env_args(
        args.args,
        {
            key: str
            for key in (
                "IP",
                "GATEWAY",
                "K8S_POD_NAME",
                "K8S_POD_NAMESPACE",
                "K8S_POD_INFRA_CONTAINER_ID",
            )
        },
    )
    addresses = list(static.addresses)
    for item in env.get("IP", "").split(",") if env.get("IP") else ():
        text = item.strip()
        parsed = parse_cidr_sloppy(text)
        if parsed is None:
            raise _invalid(f"invalid CIDR {text}: invalid CIDR address: {text}")
        addresses.append(IPConfig(address=_interface(*parsed)))
    for item in env.get("GATEWAY", "").split(",") if env.get("GATEWAY") else ():
        gateway = parse_ip_sloppy(item.strip())
        if gateway is None:
            raise _invalid(f"invalid gateway address: {item}")
        addresses = [
            a.model_copy(update={"gateway": gateway}) if gateway in a.address.network else a
            for a in addresses
        ]
    _check_families(static.version, addresses)
    return replace(
        static,
        addresses=tuple(addresses),
        pod_namespace=env.get("K8S_POD_NAMESPACE", ""),
        pod_name=env.get("K8S_POD_NAME", ""),
    )


def _flat_file(root: str) -> str:
    """The flat file's text ("" if none exists); unreadable or not JSON is an error."""
    for path in FLAT_FILES:
        full = root + path
        if not os.path.exists(full):
            continue
        try:
            with open(full, "rb") as f:
                return f.read().decode(errors="replace") or "{}"
        except OSError as err:
            raise CNIError(
                ErrorCode.IO_FAILURE, f"error opening flat configuration file @ {path}", str(err)
            ) from None
    return ""


@lru_cache(maxsize=64)
def _from_conf(text: str, flat_text: str) -> WhereaboutsConfig:
    """The config's own part of load_config, kept per (config, flat file) text."""
    conf = json.loads(text)
    name = require_name(conf)
    version = conf_version(conf)
    ipam = parse_conf(_Net, conf).ipam
    if ipam is None:
        raise _invalid("IPAM config missing 'ipam' key")
    if ipam.type != IPAM_TYPE:
        raise _invalid(
            "only interested in networks whose IPAM type is 'whereabouts'. "
            f"This one was: {ipam.type}"
        )
    if flat_text:
        try:
            flat_raw = json.loads(flat_text)
        except ValueError as err:
            raise _invalid(f"LoadIPAMConfig Flatfile - JSON Parsing Error: {err}") from None
        flat = parse_conf(WhereaboutsIPAM, flat_raw if isinstance(flat_raw, dict) else {})
        ipam = merge(ipam, flat)
    gateway = None
    if ipam.gateway:
        gateway = parse_ip_sloppy(ipam.gateway)
        if gateway is None:
            raise _invalid(f"couldn't parse gateway IP: {ipam.gateway}")
    addresses = []
    for entry in ipam.addresses:
        parsed = parse_cidr_sloppy(entry.address)
        if parsed is None:
            raise _invalid(
                f"invalid CIDR in addresses {entry.address}: invalid CIDR address: {entry.address}"
            )
        addresses.append(IPConfig(address=_interface(*parsed), gateway=entry.gateway))
    return WhereaboutsConfig(
        name=name,
        version=version,
        ranges=tuple(_ranges(ipam)),
        gateway=gateway,
        network_name=ipam.network_name,
        overlapping=ipam.enable_overlapping_ranges is not False,
        node_slice_size=ipam.node_slice_size,
        routes=tuple(r.to_route() for r in ipam.routes),
        dns=DNS.model_validate(ipam.dns.model_dump()),
        addresses=tuple(addresses),
    )


def merge(inline: WhereaboutsIPAM, flat: WhereaboutsIPAM) -> WhereaboutsIPAM:
    """mergo.Merge without override: each key the config leaves at its zero value takes the
    flat file's (nested objects key by key); `enable_overlapping_ranges` stays inline."""
    values: dict[str, Any] = {}
    for name in type(inline).model_fields:
        mine, theirs = getattr(inline, name), getattr(flat, name)
        if name == "enable_overlapping_ranges":
            values[name] = mine
        elif isinstance(mine, ConfModel):
            values[name] = type(mine).model_construct(
                **{k: getattr(mine, k) or getattr(theirs, k) for k in type(mine).model_fields}
            )
        else:
            values[name] = mine or theirs
    return WhereaboutsIPAM.model_construct(**values)


def _ranges(ipam: WhereaboutsIPAM) -> list[IPRange]:
    """`range` (with the top-level bounds and exclusions) first, then `ipRanges`."""
    specs = list(ipam.ip_ranges)
    if ipam.range:
        top = _RangeConf.model_construct(
            range=ipam.range,
            range_start=parse_ip_sloppy(ipam.range_start),
            range_end=parse_ip_sloppy(ipam.range_end),
            exclude=ipam.exclude,
        )
        specs.insert(0, top)
    return [_range(spec) for spec in specs]


def _range(spec: _RangeConf) -> IPRange:
    start, sep, rest = spec.range.partition("-")
    if sep:
        first = parse_ip_sloppy(start)
        if first is None:
            raise _invalid(f"invalid range start IP: {start}")
        parsed = parse_cidr_sloppy(rest)
        if parsed is None:
            raise _invalid(
                "invalid CIDR (do you have the 'range' parameter set for Whereabouts?) "
                f"'{rest}': invalid CIDR address: {rest}"
            )
        last, network = parsed
        if first.version != network.version or first not in network:
            raise _invalid(f"invalid range start for CIDR {network}: {first}")
        return IPRange(network, first, last, tuple(spec.exclude))
    parsed = parse_cidr_sloppy(spec.range)
    if parsed is None:
        raise _invalid(f"invalid CIDR {spec.range}: invalid CIDR address: {spec.range}")
    return IPRange(parsed[1], spec.range_start, spec.range_end, tuple(spec.exclude))


def _interface(addr: IPAddress, network: Network) -> IPInterface:
    """The address with its network's prefix length ("10.0.0.5/24")."""
    return ip_interface(f"{addr}/{network.prefixlen}")


def _check_families(version: str, addresses: list[IPConfig]) -> None:
    """As whereabouts: 0.1.0/0.2.0 allow one static address per family."""
    versions = [a.address.version for a in addresses]
    if before(version, "0.3.0") and (versions.count(4) > 1 or versions.count(6) > 1):
        raise _invalid(f"CNI version {version} does not support more than 1 address per family")


def _invalid(msg: str) -> CNIError:
    return CNIError(ErrorCode.INVALID_CONFIG, msg)

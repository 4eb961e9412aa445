"""The host-local IPAM, in process, sharing ranges and on-disk state with the reference.

Config (the reference's): a legacy single range (`subnet`, `rangeStart`, `rangeEnd`,
`gateway`) and/or `ranges` (a list of range sets, each a list of ranges), `routes`,
`dataDir`, `resolvConf`; the `ipRanges` capability prepends range sets. Requested addresses
come from CNI_ARGS `IP=`, `args.cni.ips` and the `ips` capability (`runtimeConfig.ips`);
each range set takes the first requested address it contains, and any left over fail the
ADD. ADD gives one address per range set; an ADD for a container+ifname that already holds
an address in a range set fails ("duplicate allocation is not allowed"). DEL releases the
container+ifname's addresses and is idempotent; CHECK only checks that a reservation exists.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from ipaddress import ip_interface
from typing import Any

from pydantic import Field

from cni import callscope
from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from cni.fileio import read_regular
from cni.result import DNS, IPConfig, Result, Route
from delegates.ipam.common import (
    CHECK_FAILED,
    ConfModel,
    GoCIDR,
    GoIP,
    IPAddress,
    RequestedIP,
    RouteConf,
    check_families,
    conf_version,
    load_env_args,
    parse_conf,
    parse_ip_or_cidr,
    require_name,
)
from delegates.ipam.ranges import (
    Range,
    RangeError,
    candidates,
    make_range_set,
    range_for,
    set_string,
    sets_overlap,
)
from delegates.ipam.store import Store, open_store

MAX_RESOLV_CONF = 65536
"""Bytes a resolvConf file may hold (glibc reads a few KiB of one)."""


class RangeConf(ConfModel):
    """One range as configured."""

    subnet: GoCIDR | None = None
    range_start: GoIP | None = Field(default=None, alias="rangeStart")
    range_end: GoIP | None = Field(default=None, alias="rangeEnd")
    gateway: GoIP | None = None


class HostLocalIPAM(RangeConf):
    """The `ipam` section; the inherited fields are the legacy single range."""

    type: str = ""
    routes: list[RouteConf] = Field(default_factory=list)
    data_dir: str = Field(default="", alias="dataDir")
    resolv_conf: str = Field(default="", alias="resolvConf")
    ranges: list[list[RangeConf]] = Field(default_factory=list)


class _RuntimeConfig(ConfModel):
    ips: list[RequestedIP] = Field(default_factory=list)
    ip_ranges: list[list[RangeConf]] = Field(default_factory=list, alias="ipRanges")


class _CNIArgs(ConfModel):
    ips: list[RequestedIP] = Field(default_factory=list)


class _Args(ConfModel):
    cni: _CNIArgs = Field(default_factory=_CNIArgs)


class _Attachment(ConfModel):
    container_id: str = Field(alias="containerID")
    ifname: str


class _Net(ConfModel):
    ipam: HostLocalIPAM | None = None
    runtime_config: _RuntimeConfig = Field(default_factory=_RuntimeConfig, alias="runtimeConfig")
    args: _Args = Field(default_factory=_Args)
    valid_attachments: list[_Attachment] = Field(
        default_factory=list, alias="cni.dev/valid-attachments"
    )


@dataclass(frozen=True)
class HostLocalConfig:
    """A validated host-local config."""

    name: str
    version: str
    range_sets: list[list[Range]]
    requested: list[IPAddress]
    routes: list[Route]
    data_dir: str
    resolv_conf: str
    valid_attachments: frozenset[tuple[str, str]]


def load_config(conf: Mapping[str, Any], args: CmdArgs) -> HostLocalConfig:
    """Validate the plugin config and the requests in CNI_ARGS; CNIError as documented."""
    static = _from_conf(json.dumps(conf, sort_keys=True))
    env = load_env_args(args.args, {"IP": parse_ip_or_cidr})
    wanted = [env["IP"]] if env.get("IP") is not None else []
    wanted += static.conf_requests
    requested = [ip for ip in wanted if ip is not None]
    if len(requested) != len(wanted):
        raise CNIError(ErrorCode.INVALID_CONFIG, "cannot understand ip: IP <nil> not v4 nor v6")
    if static.error is not None:
        raise CNIError(static.error.code, static.error.msg, static.error.details)
    return replace(static.config, requested=list(dict.fromkeys(requested)))


@dataclass(frozen=True)
class _Static:
    """What a config alone decides, checked in the order load_config reports it: the
    requests it makes, then its ranges (an invalid one is `error`, raised after CNI_ARGS
    is read, as the reference does)."""

    config: HostLocalConfig
    conf_requests: list[IPAddress | None]
    error: CNIError | None = None


@lru_cache(maxsize=64)
def _from_conf(text: str) -> _Static:
    """The config's part of load_config, kept per config (its JSON, keys sorted): a pod's
    ADD and DEL and every pod on one network parse the same one (~0.15 ms each)."""
    conf = json.loads(text)
    name = require_name(conf)
    version = conf_version(conf)
    net = parse_conf(_Net, conf)
    ipam = net.ipam
    if ipam is None:
        raise CNIError(ErrorCode.INVALID_CONFIG, "IPAM config missing 'ipam' key")
    config = HostLocalConfig(
        name=name,
        version=version,
        range_sets=[],
        requested=[],
        routes=[r.to_route() for r in ipam.routes],
        data_dir=ipam.data_dir,
        resolv_conf=ipam.resolv_conf,
        valid_attachments=frozenset((a.container_id, a.ifname) for a in net.valid_attachments),
    )
    requests: list[IPAddress | None] = [*net.args.cni.ips, *net.runtime_config.ips]
    try:
        range_sets = _range_sets(version, net, ipam)
    except CNIError as err:
        return _Static(config, requests, err)
    return _Static(replace(config, range_sets=range_sets), requests)


def _range_sets(version: str, net: _Net, ipam: HostLocalIPAM) -> list[list[Range]]:
    specs = list(net.runtime_config.ip_ranges)
    if ipam.subnet is not None:
        specs.append([ipam])
    specs += ipam.ranges
    if not specs:
        raise CNIError(ErrorCode.INVALID_CONFIG, "no IP ranges specified")
    range_sets = []
    for i, spec in enumerate(specs):
        try:
            range_sets.append(make_range_set(spec))
        except RangeError as err:
            raise CNIError(ErrorCode.INVALID_CONFIG, f"invalid range set {i}: {err}") from None
    check_families(version, (rs[0].subnet.version for rs in range_sets))
    for i, first in enumerate(range_sets):
        for j, second in enumerate(range_sets[i + 1 :], start=i + 1):
            if sets_overlap(first, second):
                raise CNIError(ErrorCode.INVALID_CONFIG, f"range set {i} overlaps with {j}")
    return range_sets


def add(conf: Mapping[str, Any], args: CmdArgs) -> Result:
    """Reserve one address per range set for args.container_id/args.ifname."""
    cfg = load_config(conf, args)
    dns = parse_resolv_conf(cfg.resolv_conf) if cfg.resolv_conf else DNS()
    with open_store(cfg.name, cfg.data_dir) as store:
        ips = _allocate(store, cfg, args.container_id, args.ifname)
    result = Result(cni_version=cfg.version, ips=ips, routes=cfg.routes, dns=dns)
    return result.convert(cfg.version)


def delete(conf: Mapping[str, Any], args: CmdArgs) -> None:
    """Release every address the container+ifname holds in this network (idempotent)."""
    cfg = load_config(conf, args)
    with open_store(cfg.name, cfg.data_dir) as store:
        for _ in cfg.range_sets:  # as the reference: once per range set
            store.release(args.container_id, args.ifname)


def check(conf: Mapping[str, Any], args: CmdArgs) -> None:
    """Succeed if the container+ifname holds an address in this network."""
    cfg = load_config(conf, args)
    with open_store(cfg.name, cfg.data_dir) as store:
        found = store.find_by_id(args.container_id, args.ifname)
    if not found:
        raise CNIError(
            CHECK_FAILED,
            f"host-local: Failed to find address added by container {args.container_id}",
        )


def gc(conf: Mapping[str, Any], args: CmdArgs) -> None:
    """Release reservations of attachments missing from `cni.dev/valid-attachments`."""
    cfg = load_config(conf, args)
    with open_store(cfg.name, cfg.data_dir) as store:
        store.gc(cfg.valid_attachments)


def _allocate(store: Store, cfg: HostLocalConfig, cid: str, ifname: str) -> list[IPConfig]:
    pending = list(cfg.requested)
    ips: list[IPConfig] = []
    for idx, ranges in enumerate(cfg.range_sets):
        wanted = next((ip for ip in pending if range_for(ranges, ip)), None)
        if wanted is not None:
            pending.remove(wanted)
        try:
            ips.append(_get(store, ranges, str(idx), cid, ifname, wanted))
        except CNIError as err:
            if ips:
                store.release(cid, ifname)
            msg = f"failed to allocate for range {idx}: {err.msg}"
            raise CNIError(err.code, msg, err.details) from None
    if pending:
        store.release(cid, ifname)
        missing = " ".join(str(ip) for ip in pending)
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            f"failed to allocate all requested IPs: {missing}",
            "a requested IP must lie inside one range set's [rangeStart, rangeEnd]",
        )
    return ips


def _get(
    store: Store,
    ranges: list[Range],
    range_id: str,
    cid: str,
    ifname: str,
    wanted: IPAddress | None,
) -> IPConfig:
    """Reserve `wanted`, or the next free address of the set in round-robin order."""
    if wanted is not None:
        r = range_for(ranges, wanted)
        assert r is not None  # the caller picked `wanted` because the set contains it
        if wanted == r.gateway:
            raise CNIError(ErrorCode.INVALID_CONFIG, f"requested ip {wanted} is subnet's gateway")
        if not store.reserve(cid, ifname, wanted, range_id):
            raise CNIError(
                ErrorCode.TRY_AGAIN_LATER,
                f"requested IP address {wanted} is not available in range set {set_string(ranges)}",
            )
        return _ip_config(wanted, r)
    for held in store.get_by_id(cid, ifname):
        if range_for(ranges, held):
            raise CNIError(
                ErrorCode.TRY_AGAIN_LATER,
                f"{held} has been allocated to {cid}, duplicate allocation is not allowed",
                "DEL the container's interface first",
            )
    for ip, r in candidates(ranges, store.last_reserved(range_id)):
        if store.reserve(cid, ifname, ip, range_id):
            return _ip_config(ip, r)
    raise CNIError(
        ErrorCode.TRY_AGAIN_LATER,
        f"no IP addresses available in range set: {set_string(ranges)}",
    )


def _ip_config(ip: IPAddress, r: Range) -> IPConfig:
    return IPConfig(address=ip_interface(f"{ip}/{r.subnet.prefixlen}"), gateway=r.gateway)


def parse_resolv_conf(path: str) -> DNS:
    """DNS settings from a resolv.conf: nameserver, domain, search and options lines.
    Read under the call's root, as the data dir: a regular file of at most
    MAX_RESOLV_CONF bytes, not through a symlink."""
    try:
        text = read_regular(callscope.current().on_host(path), MAX_RESOLV_CONF).decode(
            errors="replace"
        )
    except OSError as err:
        reason = err.strerror or str(err)  # Go spells it in lower case
        raise CNIError(
            ErrorCode.IO_FAILURE, f"open {path}: {reason[:1].lower()}{reason[1:]}"
        ) from None
    dns = DNS()
    for raw in text.split("\n"):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        fields = line.split()
        if len(fields) < 2:
            continue
        if fields[0] == "nameserver":
            dns.nameservers.append(fields[1])
        elif fields[0] == "domain":
            dns.domain = fields[1]
        elif fields[0] == "search":
            dns.search.extend(fields[1:])
        elif fields[0] == "options":
            dns.options.extend(fields[1:])
    return dns

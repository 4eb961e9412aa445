"""`plexus inspect`: what this node's attachments are, and what is wrong with them.

It reads the attachment records and the result cache under `cniDir` and compares them
with the kernel: does each container's namespace still exist, does it hold each
interface, with the addresses the cached result gave it? Results with no record are
listed too, and so are unreadable state files and host-local leases (in the ranges
Plexus allocates from, see meta/ranges.py) held by a container Plexus has no record of:
leaked IPs, which GC releases (meta.ranges.unowned_leases is what both use). Nothing is changed;
every problem line says what would fix it.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass, field
from typing import Any

from cni.cache import CacheEntry, ResultCache
from cni.errors import CNIError
from delegates.link import addresses, links, netlink
from delegates.netns import netns_exists, run_in_netns
from meta.config import MetaConfig
from meta.delegate import Delegate
from meta.ranges import Lease, unowned_leases
from meta.records import AttachmentRecord, RecordStore

Live = dict[str, list[str]]  # ifname -> addresses (CIDR) in a namespace


@dataclass
class InterfaceState:
    ifname: str
    network: str
    plugins: list[str]
    device_id: str = ""
    ips: list[str] = field(default_factory=list)  # from the cached result
    mac: str = ""
    present: bool | None = None  # None: the namespace could not be looked at
    problems: list[str] = field(default_factory=list)


@dataclass
class ContainerState:
    container_id: str
    pod: str
    netns: str
    netns_exists: bool
    interfaces: list[InterfaceState]
    problems: list[str] = field(default_factory=list)


@dataclass
class NodeReport:
    cni_dir: str
    containers: list[ContainerState]
    orphan_results: list[str]  # cache files with no attachment record
    orphan_leases: list[Lease]  # host-local reservations of containers with no record
    unreadable: list[str]  # records and cache files that cannot be read

    @property
    def healthy(self) -> bool:
        return (
            not self.orphan_results
            and not self.orphan_leases
            and not self.unreadable
            and not any(
                c.problems or any(i.problems for i in c.interfaces) for c in self.containers
            )
        )


def _live_addresses(netns: str) -> Live:
    def read() -> Live:
        with netlink() as nl:
            return {
                found.name: [str(ip) for ip, _ in addresses(nl, found.index)] for found in links(nl)
            }

    return run_in_netns(netns, read)


def _interface(delegate: Delegate, entry: CacheEntry | None, live: Live | None) -> InterfaceState:
    state = InterfaceState(
        ifname=delegate.ifname,
        network=delegate.network,
        plugins=delegate.plugin_types,
        device_id=delegate.device_id,
    )
    if entry is None or entry.result is None:
        state.problems.append("no cached result: the ADD did not finish (DEL cleans up)")
    else:
        result = entry.result
        state.ips = [str(ip.get("address", "")) for ip in result.get("ips", [])]
        for iface in result.get("interfaces", []):
            if iface.get("name") == delegate.ifname and iface.get("sandbox"):
                state.mac = str(iface.get("mac", ""))
    if live is None:
        return state
    state.present = delegate.ifname in live
    if not state.present:
        state.problems.append(f"{delegate.ifname} is not in the namespace: CHECK fails, DEL it")
        return state
    have = {ipaddress.ip_interface(a) for a in live[delegate.ifname]}
    for address in state.ips:
        if address and ipaddress.ip_interface(address) not in have:
            state.problems.append(f"{address} is not on {delegate.ifname}")
    return state


def _container(record: AttachmentRecord, cache: ResultCache) -> ContainerState:
    exists = netns_exists(record.netns)
    state = ContainerState(
        container_id=record.container_id,
        pod=f"{record.pod_namespace}/{record.pod_name}" if record.pod_name else "",
        netns=record.netns,
        netns_exists=exists,
        interfaces=[],
    )
    live: Live | None = None
    if not exists:
        state.problems.append("namespace gone: its IPs stay reserved until DEL or GC")
    else:
        try:
            live = _live_addresses(record.netns)
        except CNIError as exc:
            state.problems.append(f"cannot look into the namespace: {exc.msg}")
    for delegate in record.delegates:
        try:
            entry = cache.load(delegate.network_config().name, record.container_id, delegate.ifname)
        except CNIError as exc:
            entry = None
            state.problems.append(exc.msg)
        state.interfaces.append(_interface(delegate, entry, live))
    return state


def inspect_node(conf: MetaConfig) -> NodeReport:
    """The report for the records and results under `conf.cni_dir`."""
    store = RecordStore(conf.cni_dir)
    records, bad_records = store.scan()
    cache = ResultCache(conf.cni_dir)
    entries, bad_entries = cache.scan()
    recorded = {
        (d.network_config().name, r.container_id, d.ifname) for r in records for d in r.delegates
    }
    orphans = [
        str(cache.path(e.network_name, e.container_id, e.ifname))
        for e in entries
        if (e.network_name, e.container_id, e.ifname) not in recorded
    ]
    unreadable = [f"{store.path(cid)}: {exc.details}" for cid, exc in bad_records.items()]
    unreadable += [f"{path}: {exc.msg} {exc.details}".rstrip() for path, exc in bad_entries.items()]
    return NodeReport(
        conf.cni_dir,
        [_container(r, cache) for r in records],
        orphans,
        unowned_leases(conf, records, bad_records),
        unreadable,
    )


def to_json(report: NodeReport) -> str:
    out: dict[str, Any] = asdict(report)
    out["healthy"] = report.healthy
    return json.dumps(out, indent=2)


def render(report: NodeReport) -> str:
    """The human-readable report."""
    lines = [f"attachments under {report.cni_dir}: {len(report.containers)} container(s)"]
    for c in report.containers:
        pod = f"pod {c.pod}  " if c.pod else ""
        lines.append(f"container {c.container_id[:12]}  {pod}netns {c.netns or '-'}")
        lines.extend(f"  ! {p}" for p in c.problems)
        for i in c.interfaces:
            where = {True: "present", False: "MISSING", None: "?"}[i.present]
            extra = f"  device {i.device_id}" if i.device_id else ""
            ips = ",".join(i.ips) or "-"
            lines.append(
                f"  {i.ifname:<8} {i.network} ({'+'.join(i.plugins)})  {ips}  {i.mac or '-'}"
                f"  {where}{extra}"
            )
            lines.extend(f"    ! {p}" for p in i.problems)
    if report.orphan_results:
        lines.append(
            "cached results with no attachment record (DEL of those attachments cleans up):"
        )
        lines.extend(f"  {path}" for path in report.orphan_results)
    if report.unreadable:
        lines.append("unreadable state files (DEL and GC treat them as lost):")
        lines.extend(f"  {line}" for line in report.unreadable)
    if report.orphan_leases:
        lines.append(
            "host-local leases of containers Plexus has no record of (leaked: GC releases them):"
        )
        lines.extend(
            f"  {lease.ip} in {lease.data_dir}/{lease.network} by {lease.container_id[:12]}"
            f" ({lease.ifname or '-'})"
            for lease in report.orphan_leases
        )
    lines.append("healthy" if report.healthy else "problems found")
    return "\n".join(lines)

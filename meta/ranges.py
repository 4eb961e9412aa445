"""The host-local ranges Plexus allocates from on this node, remembered while in use.

A lease in one of these ranges held by a container that no attachment record and no
runtime accounts for is a leak GC may release. The record cannot say which ranges
exist once it is lost, and neither can a NAD once it is deleted, so every range an
attachment uses is noted here when its record is saved: one file per (data dir,
network) under `<cniDir>/ranges/`, written once, durably. GC forgets a range once no
record, configured delegate or lease uses it (the next ADD in it notes it again).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cni import jsonio
from cni.errors import CNIError, ErrorCode
from cni.fileio import write_atomic
from delegates.ipam.store import DEFAULT_DATA_DIR, leases
from meta.config import MetaConfig
from meta.records import AttachmentRecord

Range = tuple[str, str]  # (host-local data dir, network name): the dir <data dir>/<network>
_MAX_NOTE = 8192  # bytes of one noted range's file


def host_local_ranges(configs: Iterable[dict[str, Any]]) -> set[Range]:
    """The host-local ranges these confs or conflists allocate from."""
    found = set()
    for config in configs:
        name = config.get("name")
        for plugin in config.get("plugins", [config]):
            ipam = plugin.get("ipam") if isinstance(plugin, dict) else None
            if (
                isinstance(name, str)
                and isinstance(ipam, dict)
                and ipam.get("type") == "host-local"
            ):
                found.add((str(ipam.get("dataDir") or DEFAULT_DATA_DIR), name))
    return found


class RangeLedger:
    """The ranges noted so far, one small JSON file each."""

    def __init__(self, cni_dir: str | Path) -> None:
        self.directory = Path(cni_dir) / "ranges"

    def note(self, configs: Iterable[dict[str, Any]]) -> None:
        """Remember the host-local ranges of these configs (a stat each when known)."""
        for data_dir, network in host_local_ranges(configs):
            key = hashlib.sha256(f"{data_dir}\0{network}".encode()).hexdigest()[:32]
            path = self.directory / key
            if path.exists():
                continue
            body = json.dumps({"dataDir": data_dir, "network": network}).encode()
            try:
                self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                write_atomic(path, body, fsync=True)
            except OSError as exc:
                raise CNIError(
                    ErrorCode.IO_FAILURE,
                    f"cannot note a host-local range in {self.directory}",
                    str(exc),
                ) from exc

    def all(self) -> set[Range]:
        """Every range noted (unreadable files are skipped: they were never complete)."""
        return set(self._noted().values())

    def forget(self, keep: Collection[Range]) -> list[Range]:
        """Drop every noted range not in `keep` (nothing allocates from it any more);
        the ranges dropped."""
        dropped = []
        for path, noted in self._noted().items():
            if noted not in keep:
                path.unlink(missing_ok=True)
                dropped.append(noted)
        return dropped

    def _noted(self) -> dict[Path, Range]:
        found: dict[Path, Range] = {}
        for path in sorted(self.directory.iterdir()) if self.directory.is_dir() else []:
            try:
                body = jsonio.loads(path.read_bytes(), str(path), _MAX_NOTE)
                found[path] = (str(body["dataDir"]), str(body["network"]))
            except (OSError, CNIError, KeyError, TypeError):
                continue
        return found


@dataclass
class Lease:
    """One host-local reservation: an IP of a range held by a container's interface."""

    data_dir: str
    network: str
    ip: str
    container_id: str
    ifname: str


def ranges_in_use(conf: MetaConfig, records: list[AttachmentRecord]) -> set[Range]:
    """The ranges the config's delegates and the recorded attachments allocate from."""
    return host_local_ranges([*conf.delegates, *(d.config for r in records for d in r.delegates)])


def range_leases(ranges: Collection[Range]) -> list[Lease]:
    """Every lease held in `ranges`."""
    return [
        Lease(data_dir, network, ip, cid, ifname)
        for data_dir in sorted({d for d, _ in ranges})
        for network, ip, cid, ifname in leases(data_dir)
        if (data_dir, network) in ranges
    ]


def unowned_leases(
    conf: MetaConfig, records: list[AttachmentRecord], accounted: Collection[str] = ()
) -> list[Lease]:
    """Leases in the ranges Plexus allocates from (noted ones, the config's, the records')
    held by containers that neither a record nor `accounted` (container IDs) owns."""
    ranges = RangeLedger(conf.cni_dir).all() | ranges_in_use(conf, records)
    owners = {r.container_id for r in records} | set(accounted)
    return [lease for lease in range_leases(ranges) if lease.container_id not in owners]

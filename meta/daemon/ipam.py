"""The daemon's cluster-wide IPAM: whereabouts served in process, reconciled, measured.

The IPAM (delegates.ipam.whereabouts, its pool watch included) loads with its first use:
the first whereabouts call, or a reconcile round that finds something to do. Every
`ipamReconcileSeconds` (and once at start) the daemon releases the allocations its node
made (found by their reservations) whose container is known dead: it has no attachment
record here (records are written before ADD allocates and removed only once DEL has
released), or its record's pod UID is no longer a pod on the API server and its network
namespace is gone. The reservations are listed before the records are read, so an ADD
racing the reconcile is never taken for dead. Then, when Plexus has allocated anywhere,
whichever daemon holds the Lease `plexus-ipam-node-release` releases the allocations of
nodes the API server no longer has, and those of IPAMClaims being deleted (whose finalizer
it then drops). Metrics: addresses used and free per pool.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from ipaddress import ip_network
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from cni.env import CmdArgs
from cni.errors import CNIError
from cni.packages import skip_package_init
from cni.result import Result
from delegates.ipam.whereabouts.labels import (
    CLAIM_FINALIZER,
    IPAMCLAIMS_PATH,
    NODE_LABEL,
    RESERVATIONS,
)
from delegates.netns import netns_exists
from kube.api import APIError, get_object
from kube.lease import Lease
from meta.daemon.config import DaemonConfig
from meta.daemon.metrics import Metrics
from meta.records import AttachmentRecord, RecordStore
from meta.sources.kube import KubeSource

skip_package_init("prometheus_client")  # as meta/daemon/metrics.py: its __init__ is heavy
from prometheus_client.metrics_core import GaugeMetricFamily  # noqa: E402
from prometheus_client.registry import Collector  # noqa: E402

if TYPE_CHECKING:
    from delegates.ipam.whereabouts.plugin import ClusterIPAM

log = logging.getLogger("plexus.ipam")

LEASE_NAME = "plexus-ipam-node-release"
GROUP_VERSION = "whereabouts.cni.cncf.io/v1alpha1"


class DaemonIPAM:
    """The daemon's ClusterIPAM (made on first use) and its reconcile thread."""

    def __init__(self, conf: DaemonConfig, source: KubeSource, node: str) -> None:
        self.source = source
        self.node = node
        self.namespace = conf.whereabouts_namespace
        self.records = RecordStore(conf.cni_dir)
        self.period = conf.ipam_reconcile_seconds
        self.reserve = conf.ipam_reserve
        self.journal = Path(conf.cni_dir) / "whereabouts-rewrites"  # stock.py's journal
        self.lease = Lease(source.api, self.namespace, LEASE_NAME, node, 3 * self.period)
        self.plugin = _Served(self)
        """What the executor serves `whereabouts` with (cni.skel.Plugin)."""
        self._ipam: ClusterIPAM | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ipam-reconcile", daemon=True)

    @property
    def ipam(self) -> ClusterIPAM:
        """The IPAM, made on first use (its pool watch starts with its first shared pool)."""
        with self._lock:
            if self._ipam is None:
                from delegates.ipam.whereabouts.plugin import ClusterIPAM

                self._ipam = ClusterIPAM(
                    self.source.api,
                    self.node,
                    self.namespace,
                    reserve=self.reserve,
                    journal=self.journal,
                )
            return self._ipam

    def start(self, metrics: Metrics) -> None:
        metrics.registry.register(_PoolUsage(self))
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            if self._ipam is not None:
                self._ipam.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile()
            except Exception as exc:  # the next round tries again; the thread must live on
                log.warning("ipam reconcile failed", extra={"error": str(exc)})
            self._stop.wait(self.period)

    def reconcile(self) -> None:
        """One round: this node's dead containers, then (Lease holder) dead nodes and
        deleted claims; nothing is loaded while Plexus has allocated nothing."""
        if not self.node:
            return
        if self._reserved(f"{NODE_LABEL}={self.node}"):
            self.ipam.allocator.collect(self._dead_here)
        claims = self._deleted_claims()
        if (claims or self._reserved(NODE_LABEL)) and self.lease.try_hold():
            self.release_dead_nodes()
            self.release_deleted_claims(claims)

    def _reserved(self, selector: str) -> bool:
        """Whether any reservation matches label `selector` (False without the CRD)."""
        query = urlencode({"labelSelector": selector, "limit": "1"})
        path = f"/apis/{GROUP_VERSION}/namespaces/{self.namespace}/{RESERVATIONS}?{query}"
        try:
            return bool(self.source.api.request("GET", path).get("items"))
        except APIError as exc:
            if exc.status == 404:
                return False
            raise

    def _deleted_claims(self) -> list[dict[str, Any]]:
        """IPAMClaims being deleted that Plexus still holds ([] without the CRD)."""
        try:
            found = self.source.api.request("GET", IPAMCLAIMS_PATH)
        except APIError as exc:
            if exc.status == 404:
                return []
            raise
        return [
            c
            for c in found.get("items", [])
            if c["metadata"].get("deletionTimestamp")
            and CLAIM_FINALIZER in (c["metadata"].get("finalizers") or [])
        ]

    def _dead_here(self, node: str, container_id: str, ifname: str) -> bool:
        try:
            record = self.records.load(container_id)
        except CNIError:
            return False  # unreadable: not known dead
        return record is None or self._gone(record)

    def _gone(self, record: AttachmentRecord) -> bool:
        """The record's pod is no longer on the API server (by UID) and its namespace is
        gone: the runtime's DEL did not reach us and will not be needed."""
        if netns_exists(record.netns) or not record.pod_uid:
            return False
        pods = self.source.pods
        if pods is not None and pods.synced.is_set():
            pod = pods.get(record.pod_namespace, record.pod_name)
            return pod is None or pod.uid != record.pod_uid
        path = f"/api/v1/namespaces/{record.pod_namespace}/pods/{record.pod_name}"
        found = get_object(self.source.api, path)
        uid = ((found or {}).get("metadata") or {}).get("uid")
        return uid != record.pod_uid

    def release_dead_nodes(self) -> int:
        """Release what Plexus allocated (and reserved ahead) on nodes the API server no
        longer has, and give their slices back. The
        reservations are listed before the nodes: a node that joins meanwhile is listed."""
        holders = {
            (obj.get("metadata") or {}).get("labels", {}).get(NODE_LABEL, "")
            for obj in self.ipam.store.reservations(NODE_LABEL)
        }
        nodes = {
            str((n.get("metadata") or {}).get("name", ""))
            for n in self.source.api.request("GET", "/api/v1/nodes").get("items", [])
        }
        if self.node not in nodes:  # this node's own Node missing: the list is not to be trusted
            log.warning("this node is not among the API server's nodes; no node released")
            return 0
        gone = holders - nodes - {""}
        if not gone:
            return 0
        log.info("releasing the addresses of deleted nodes", extra={"nodes": sorted(gone)})
        released = self.ipam.allocator.collect(lambda node, _cid, _if: node in gone, NODE_LABEL)
        from delegates.ipam.whereabouts.stock import drop_reserved

        drop_reserved(self.ipam.allocator, sorted(gone))  # what they reserved ahead
        slices = self.ipam.allocator.slices
        if slices is not None:
            for node in sorted(gone):
                slices.free(node)  # their slices, emptied above, go to the next node to ask
        return released

    def release_deleted_claims(self, claims: list[dict[str, Any]]) -> int:
        """Free the addresses of IPAMClaims being deleted, then let the claims go."""
        from delegates.ipam.whereabouts.claims import release_claim

        for claim in claims:
            release_claim(self.ipam.allocator, claim)
            self.ipam.claims.release(claim)
        return len(claims)


class _Served:
    """cni.skel.Plugin for the executor: each verb goes to the daemon's IPAM."""

    def __init__(self, daemon: DaemonIPAM) -> None:
        self.daemon = daemon

    def add(self, args: CmdArgs) -> Result:
        return self.daemon.ipam.add(args)

    def delete(self, args: CmdArgs) -> None:
        self.daemon.ipam.delete(args)

    def check(self, args: CmdArgs) -> None:
        self.daemon.ipam.check(args)

    def status(self, args: CmdArgs) -> None:
        self.daemon.ipam.status(args)

    def gc(self, args: CmdArgs) -> None:
        self.daemon.ipam.gc(args)


class _PoolUsage(Collector):
    """plexus_ipam_addresses{pool, state}: used and free addresses of each pool known
    (none before the IPAM's first use)."""

    def __init__(self, daemon: DaemonIPAM) -> None:
        self.daemon = daemon

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "plexus_ipam_addresses",
            "Addresses of each whereabouts IPPool, used and free (the range's usable size "
            "less those used)",
            labels=["pool", "state"],
        )
        ipam = self.daemon._ipam
        for pool in ipam.store.pools() if ipam is not None else []:
            used = len(pool.allocations)
            family.add_metric([pool.name, "used"], used)
            family.add_metric([pool.name, "free"], max(0, _usable(pool.range) - used))
        yield family


def _usable(cidr: str) -> int:
    try:
        net = ip_network(cidr, strict=False)
    except ValueError:
        return 0
    return max(0, net.num_addresses - 2)

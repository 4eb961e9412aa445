"""The daemon's cluster-wide IPAM: whereabouts served in process, reconciled, measured.

Every `ipamReconcileSeconds` (and once at start) the daemon releases the allocations its
node made (found by their reservations) whose container is known dead: it has no
attachment record here (records are written before ADD allocates and removed only once
DEL has released), or its record's pod UID is no longer a pod on the API server and its
network namespace is gone. The reservations are listed before the records are read, so an
ADD racing the reconcile is never taken for dead. Then whichever daemon holds the Lease
`plexus-ipam-node-release` releases the allocations of nodes the API server no longer has.
Metrics: addresses used and free per pool.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from ipaddress import ip_network

from cni.errors import CNIError
from cni.packages import skip_package_init
from delegates.ipam.whereabouts.plugin import ClusterIPAM
from delegates.ipam.whereabouts.pools import NODE_LABEL
from delegates.netns import netns_exists
from kube.api import get_object
from kube.lease import Lease
from meta.daemon.config import DaemonConfig
from meta.daemon.metrics import Metrics
from meta.records import AttachmentRecord, RecordStore
from meta.sources.kube import KubeSource

skip_package_init("prometheus_client")  # as meta/daemon/metrics.py: its __init__ is heavy
from prometheus_client.metrics_core import GaugeMetricFamily  # noqa: E402
from prometheus_client.registry import Collector  # noqa: E402

log = logging.getLogger("plexus.ipam")

LEASE_NAME = "plexus-ipam-node-release"


class DaemonIPAM:
    """The ClusterIPAM of a daemon with an API server, and its reconcile thread."""

    def __init__(self, conf: DaemonConfig, source: KubeSource, node: str) -> None:
        self.source = source
        self.node = node
        self.records = RecordStore(conf.cni_dir)
        self.period = conf.ipam_reconcile_seconds
        self.ipam = ClusterIPAM(source.api, node, conf.whereabouts_namespace)
        self.lease = Lease(
            source.api, conf.whereabouts_namespace, LEASE_NAME, node, 3 * self.period
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ipam-reconcile", daemon=True)

    def start(self, metrics: Metrics) -> None:
        self.ipam.start()
        metrics.registry.register(_PoolUsage(self.ipam))
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.ipam.stop()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.reconcile()
            except (CNIError, OSError) as exc:
                log.warning("ipam reconcile failed", extra={"error": str(exc)})
            self._stop.wait(self.period)

    def reconcile(self) -> None:
        """One round: this node's dead containers, then (Lease holder) dead nodes."""
        if not self.node:
            return
        self.ipam.allocator.collect(self._dead_here)
        if self.lease.try_hold():
            self.release_dead_nodes()

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
        """Release what Plexus allocated on nodes the API server no longer has. The
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
        return self.ipam.allocator.collect(lambda node, _cid, _if: node in gone, NODE_LABEL)


class _PoolUsage(Collector):
    """plexus_ipam_addresses{pool, state}: used and free addresses of each pool known."""

    def __init__(self, ipam: ClusterIPAM) -> None:
        self.ipam = ipam

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "plexus_ipam_addresses",
            "Addresses of each whereabouts IPPool, used and free (the range's usable size "
            "less those used)",
            labels=["pool", "state"],
        )
        for pool in self.ipam.store.pools():
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

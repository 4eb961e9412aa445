"""The node agent: policies from the API server, applied by NodeProvisioner, reported back.

It runs in `plexus deviceplugin --provision`, which owns discovery and the pools: `boot`
applies the recorded configs before the device plugin serves anything, and each pass hands
the pools to the device plugin (`publish`) without a restart. A pass runs when a policy,
pool config, SriovNetwork or this Node changes (watches), when the device plugin's scan sees
the PFs or VFs change (`devices_seen`: drift), and every `resync_seconds`.

When a change waits for pods (node.py), this node takes one of its pool's disruption slots
(leases.py: at most maxUnavailable nodes of a SriovNetworkPoolConfig, 1 for nodes in none,
no limit when it is unset) and evicts exactly the pods holding the VFs the change touches
(evict.py), then retries every `retry_seconds` until they are gone and the change applied,
and gives the slot back. Changes that wait for nobody never wait for a slot.
"""

from __future__ import annotations

import logging
import threading
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from deviceplugin.config import ResourceConfig
from deviceplugin.provision.crs import API_VERSION, CRError, NodePolicy, PoolConfig
from deviceplugin.provision.evict import PodRef, evict, pods_of
from deviceplugin.provision.leases import LeaseSlots
from deviceplugin.provision.networks import NETWORKS, NetworkRenderer
from deviceplugin.provision.node import NodeProvisioner, PassResult
from deviceplugin.provision.nodestate import (
    CURRENT_STATE,
    DESIRED_STATE,
    FAILED,
    IN_PROGRESS,
    SUCCEEDED,
    NodeStateWriter,
    interfaces,
)
from deviceplugin.provision.pools import DEFAULT_PREFIX
from deviceplugin.sysfs import PciNetDevice
from kube.api import APIError, KubeAPI, Stop

DEFAULT_NAMESPACE = "sriov-network-operator"
CRS = "/apis/sriovnetwork.openshift.io/v1/namespaces/{ns}/{plural}"
WATCH_SECONDS = 300
COMPONENT = "plexus-sriov"
# Answers that retrying soon will not change (no CRDs installed, no RBAC): wait a resync.
REFUSED = (401, 403, 404)

log = logging.getLogger("plexus.provision")

Json = dict[str, Any]


@dataclass(frozen=True)
class ProvisionOptions:
    node_name: str
    namespace: str = DEFAULT_NAMESPACE  # where policies, pool configs and node states live
    resource_prefix: str = DEFAULT_PREFIX
    state_dir: Path = Path("/var/lib/plexus/sriov")  # the records of what Plexus made
    resync_seconds: float = 30.0
    retry_seconds: float = 2.0  # while a change waits for pods or a slot
    lease_seconds: int = 60
    render_networks: bool = True


@dataclass
class Disruption:
    """This node's part in its pool's disruption budget."""

    slots: LeaseSlots | None = None
    evicting: bool = False
    evicted: set[PodRef] = field(default_factory=set)


def fingerprint(devices: Sequence[PciNetDevice]) -> frozenset[tuple[object, ...]]:
    """What about the PFs and VFs a pass depends on (a change wakes the agent)."""
    return frozenset(
        (d.address, d.driver, d.sriov_numvfs, d.mtu, bool(d.netdevs), d.admin_up)
        for d in devices
        if d.is_vf or d.sriov_totalvfs
    )


class ProvisionAgent:
    """Policies -> NodeProvisioner passes -> pools, node state, Events, evictions."""

    def __init__(
        self,
        api: KubeAPI,
        options: ProvisionOptions,
        provisioner: NodeProvisioner,
        publish: Callable[[list[ResourceConfig]], None],
    ) -> None:
        self.api = api
        self.options = options
        self.prov = provisioner
        self.publish = publish
        self.node = options.node_name
        self.state = NodeStateWriter(api, options.namespace, self.node)
        self.networks = (
            NetworkRenderer(
                api, options.namespace, options.resource_prefix, self.node, options.lease_seconds
            )
            if options.render_networks
            else None
        )
        self.disruption = Disruption()
        self.passes = 0
        self._published: list[ResourceConfig] | None = None
        self._seen: frozenset[tuple[object, ...]] = frozenset()
        self._warned: set[str] = set()
        self._wake = threading.Event()
        self._stop = Stop()
        self._loop = threading.Thread(target=self._run, name="sriov-agent", daemon=True)

    # -- lifecycle ------------------------------------------------------------------------

    def boot(self) -> PassResult:
        """Apply the records (no API) and publish their pools: call before serving."""
        result = self.prov.boot()
        self._publish(result.resources)
        self._seen = fingerprint(result.devices)
        return result

    def start(self) -> None:
        ns = self.options.namespace
        watches = [
            (CRS.format(ns=ns, plural="sriovnetworknodepolicies"), {}),
            (CRS.format(ns=ns, plural="sriovnetworkpoolconfigs"), {}),
            ("/api/v1/nodes", {"fieldSelector": f"metadata.name={self.node}"}),
        ]
        if self.networks is not None:
            watches.append((NETWORKS, {}))
        for path, query in watches:
            threading.Thread(target=self._watch, args=(path, query), daemon=True).start()
        self._loop.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._loop.is_alive():
            self._loop.join()
        for done in (self._release, self.networks.stop if self.networks else None):
            if done is not None:
                try:
                    done()
                except (APIError, OSError) as exc:
                    log.warning("releasing a lease on stop: %s", exc)

    def wake(self) -> None:
        self._wake.set()

    def devices_seen(self, devices: list[PciNetDevice]) -> None:
        """The device plugin's scan: wake when PFs or VFs changed since the last pass."""
        if fingerprint(devices) != self._seen:
            self.wake()

    def _run(self) -> None:
        while not self._stop.is_set():
            delay = self.options.resync_seconds
            try:
                result = self.run_pass()
                if result.waiting:
                    delay = self.options.retry_seconds
            except APIError as exc:
                if exc.status not in REFUSED:
                    delay = self.options.retry_seconds  # the server had a moment: soon again
                log.warning("provisioning pass failed: %s", exc)
            except (OSError, ValueError) as exc:
                log.warning("provisioning pass failed (retrying): %s", exc)
                delay = self.options.retry_seconds
            self._wake.wait(delay)
            self._wake.clear()

    def _watch(self, path: str, query: dict[str, str]) -> None:
        params = {**query, "watch": "1", "timeoutSeconds": str(WATCH_SECONDS)}
        url = f"{path}?{urllib.parse.urlencode(params)}"
        while not self._stop.is_set():
            try:
                for _ in self.api.watch(url, WATCH_SECONDS, self._stop):
                    if self._stop.is_set():
                        return
                    self.wake()
            except (APIError, OSError, ValueError) as exc:
                log.debug("watch %s: %s", path, exc)
                refused = isinstance(exc, APIError) and exc.status in REFUSED
                self._stop.wait(
                    self.options.resync_seconds if refused else self.options.retry_seconds
                )

    # -- one pass -------------------------------------------------------------------------

    def run_pass(self) -> PassResult:
        """Read the policies, apply what can be, evict what must go, report."""
        self.passes += 1
        node = self.api.request("GET", f"/api/v1/nodes/{self.node}")
        labels = node["metadata"].get("labels") or {}
        policies, unreadable = self._policies()
        result = self.prov.reconcile(policies, labels)
        result.rejected.update(unreadable)
        self._publish(result.resources)
        notes = self._disrupt(result, labels) if result.waiting else []
        self._report(result, str(node["metadata"].get("uid", "")), notes)
        if not result.waiting:
            self._release()  # after the report: the pool's next node sees this one Succeeded
        self._seen = fingerprint(result.devices)
        if self.networks is not None:
            try:
                self.networks.reconcile()
            except (APIError, OSError) as exc:
                log.warning("rendering SriovNetworks: %s", exc)
        return result

    def _policies(self) -> tuple[list[NodePolicy], dict[str, str]]:
        path = CRS.format(ns=self.options.namespace, plural="sriovnetworknodepolicies")
        policies, unreadable = [], {}
        for obj in self.api.request("GET", path).get("items", []):
            try:
                policies.append(NodePolicy.from_api(obj))
            except CRError as exc:
                unreadable[obj.get("metadata", {}).get("name", "?")] = str(exc)
        return policies, unreadable

    def _publish(self, resources: list[ResourceConfig]) -> None:
        if resources != self._published:
            self._published = list(resources)
            self.publish(list(resources))

    # -- disruption -----------------------------------------------------------------------

    def _pool(self, labels: dict[str, str]) -> tuple[str, int, str]:
        """This node's pool, how many of its nodes may disrupt at once (-1: any), a problem."""
        path = CRS.format(ns=self.options.namespace, plural="sriovnetworkpoolconfigs")
        pools = []
        for obj in self.api.request("GET", path).get("items", []):
            try:
                pools.append(PoolConfig.from_api(obj))
            except CRError as exc:
                log.error("%s", exc)
        mine = [p for p in pools if p.spec.node_selector and p.spec.node_selector.matches(labels)]
        if len(mine) > 1:
            names = ", ".join(sorted(p.name for p in mine))
            return "", 0, f"node is part of more than one SriovNetworkPoolConfig: {names}"
        if not mine:
            return "default", 1, ""
        pool, limit = mine[0], mine[0].spec.max_unavailable
        if limit is None:
            return pool.name, -1, ""
        if isinstance(limit, int):
            return pool.name, limit, ""
        selector = pool.spec.node_selector
        assert selector is not None
        nodes = self.api.request("GET", "/api/v1/nodes").get("items", [])
        count = sum(selector.matches(n["metadata"].get("labels") or {}) for n in nodes)
        return pool.name, count * int(limit.rstrip("%")) // 100, ""  # rounded down

    def _disrupt(self, result: PassResult, labels: dict[str, str]) -> list[str]:
        """Evict the pods holding VFs a waiting change touches, within the pool's budget."""
        holders = set().union(*result.waiting.values())
        pods, unnamed = pods_of(self.api, self.node, holders)
        notes = [f"a VF a change touches is held by {u}: nothing to evict" for u in sorted(unnamed)]
        if not pods:
            return notes
        pool, limit, problem = self._pool(labels)
        if problem:
            return [*notes, problem]
        if limit >= 0:
            d = self.disruption
            prefix = f"plexus-sriov-pool-{pool}"
            if d.slots is None or d.slots.prefix != prefix:
                self._release()
                d.slots = LeaseSlots(
                    self.api, self.options.namespace, prefix, self.node, self.options.lease_seconds
                )
            if not d.slots.acquire(limit):
                return [*notes, f"waiting for one of the {limit} disruption slots of pool {pool}"]
        self.disruption.evicting = True
        for pod in sorted(pods):
            why = evict(self.api, pod)
            if why:
                notes.append(why)
            elif pod not in self.disruption.evicted:
                self.disruption.evicted.add(pod)
                vfs = sorted(
                    vf for vf, h in result.waiting.items() if any(x.name == pod.name for x in h)
                )
                self._event(
                    "Normal",
                    "Evicting",
                    f"evicting pod {pod}: a change touches its VFs {', '.join(vfs)}",
                )
        return notes

    def _release(self) -> None:
        d = self.disruption
        if d.slots is not None and d.slots.held:
            d.slots.release()
        d.evicting = False
        d.evicted.clear()

    # -- reporting ------------------------------------------------------------------------

    def _report(self, result: PassResult, node_uid: str, notes: list[str]) -> None:
        rejected = [f"policy {n}: {why}" for n, why in sorted(result.rejected.items())]
        problems = [*rejected, *result.errors, *result.reboot]
        if problems:
            sync = FAILED
        elif result.waiting:
            sync = IN_PROGRESS
        else:
            sync = SUCCEEDED
        status: Json = {
            "interfaces": interfaces(result.devices, result.desired, result.allocations),
            "syncStatus": sync,
        }
        if problems or notes:
            status["lastSyncError"] = "; ".join([*problems, *notes])
        annotations = {
            DESIRED_STATE: "Drain_Required" if result.waiting else "Idle",
            CURRENT_STATE: "Draining" if result.waiting and self.disruption.evicting else "Idle",
        }
        spec = {"interfaces": [c.spec() for c in result.desired]}
        self.state.write(node_uid, spec, status, annotations)
        if result.changed:
            self._event("Normal", "Provisioned", "; ".join(result.changed))
        for drift in result.drift:
            self._event("Warning", "Drift", drift)
        warnings = {
            **{m: "PolicyRejected" for m in rejected},
            **{m: "ProvisioningFailed" for m in result.errors},
            **{m: "RebootRequired" for m in result.reboot},
        }
        for message, reason in warnings.items():
            if message not in self._warned:
                self._event("Warning", reason, message)
        self._warned = set(warnings)

    def _event(self, type_: str, reason: str, message: str) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        ns = self.options.namespace
        event = {
            "metadata": {"generateName": f"{self.node}.", "namespace": ns},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": "SriovNetworkNodeState",
                "namespace": ns,
                "name": self.node,
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": COMPONENT, "host": self.node},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.node,
        }
        try:
            self.api.request("POST", f"/api/v1/namespaces/{ns}/events", event)
        except (APIError, OSError) as exc:
            log.warning("event %s not recorded: %s", reason, exc)
        log.log(logging.WARNING if type_ == "Warning" else logging.INFO, "%s: %s", reason, message)

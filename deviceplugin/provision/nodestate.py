"""This node's SriovNetworkNodeState: what `kubectl get sriovnetworknodestates` shows users.

Named after the node, in the agent's namespace, owned by the Node (so it goes with it).
`spec.interfaces` is the merged config, `status.interfaces` the SR-IOV PFs with their VFs as
sysfs shows them (a VF's `assigned` names the pod holding it), `syncStatus` Succeeded,
InProgress (a change waits for pods) or Failed with `lastSyncError`. The operator's
desired/current-state annotations say whether pods must go and whether this node is
evicting them. Written only when it differs from what was last written.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from deviceplugin.provision.crs import API_VERSION, PfConfig
from deviceplugin.provision.holders import Allocations
from deviceplugin.provision.merge import sriov_pfs
from deviceplugin.provision.plan import vfs_of
from deviceplugin.sysfs import PciNetDevice
from kube.api import APIError, KubeAPI

STATES = "/apis/sriovnetwork.openshift.io/v1/namespaces/{ns}/sriovnetworknodestates"
DESIRED_STATE = "sriovnetwork.openshift.io/desired-state"
CURRENT_STATE = "sriovnetwork.openshift.io/current-state"
SUCCEEDED, IN_PROGRESS, FAILED = "Succeeded", "InProgress", "Failed"
LINK_TYPES = {"ether": "ETH", "infiniband": "IB"}

log = logging.getLogger("plexus.provision")

Json = dict[str, Any]


def _assigned(allocations: Allocations, vf: str) -> str:
    names = sorted(
        f"{h.namespace}/{h.name}" for h in allocations.get(vf, ()) if h.name and not h.claim
    )
    return ",".join(names)


def interfaces(
    devices: Sequence[PciNetDevice], desired: Sequence[PfConfig], allocations: Allocations
) -> list[Json]:
    """`status.interfaces`: the SR-IOV PFs and their VFs."""
    external = {c.pci_address for c in desired if c.externally_managed}
    out = []
    for pf in sriov_pfs(devices):
        entry: Json = {
            "name": pf.netdev,
            "mac": pf.mac,
            "driver": pf.driver,
            "pciAddress": pf.address,
            "vendor": pf.vendor,
            "deviceID": pf.device,
            "mtu": pf.mtu or 0,
            "numVfs": pf.sriov_numvfs or 0,
            "linkSpeed": f"{pf.speed} Mb/s" if pf.speed else "",
            "linkType": LINK_TYPES.get(pf.link_type, pf.link_type),
            "linkAdminState": "up" if pf.admin_up else "down",
            "eSwitchMode": "legacy",
            "externallyManaged": pf.address in external,
            "totalvfs": pf.sriov_totalvfs or 0,
        }
        vfs = [
            {
                "name": vf.netdev,
                "mac": vf.mac,
                "assigned": _assigned(allocations, vf.address),
                "driver": vf.driver,
                "pciAddress": vf.address,
                "vendor": vf.vendor,
                "deviceID": vf.device,
                "mtu": vf.mtu or 0,
                "vfID": vf.vf_index,
            }
            for vf in vfs_of(pf.address, devices)
        ]
        if vfs:
            entry["Vfs"] = [{k: v for k, v in f.items() if v or k == "vfID"} for f in vfs]
        out.append({k: v for k, v in entry.items() if v or k in ("numVfs", "externallyManaged")})
    return out


class NodeStateWriter:
    """Keeps this node's SriovNetworkNodeState as the last pass left it."""

    def __init__(self, api: KubeAPI, namespace: str, node: str) -> None:
        self.api = api
        self.path = STATES.format(ns=namespace)
        self.namespace = namespace
        self.node = node
        self._written: tuple[Json, Json, Json] | None = None

    def write(self, node_uid: str, spec: Json, status: Json, annotations: dict[str, str]) -> None:
        """Create or update the object (spec and annotations, then status) if it changed."""
        wanted = (spec, status, annotations)
        if wanted == self._written:
            return
        name = f"{self.path}/{self.node}"
        meta: Json = {"name": self.node, "namespace": self.namespace, "annotations": annotations}
        if node_uid:
            meta["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": node_uid}
            ]
        body = {"apiVersion": API_VERSION, "kind": "SriovNetworkNodeState", "metadata": meta}
        try:
            self.api.request("PATCH", name, {**body, "spec": spec}, "application/merge-patch+json")
        except APIError as exc:
            if exc.status != 404:
                raise
            self.api.request("POST", self.path, {**body, "spec": spec})
        # A merge patch replaces lists whole, and `null` drops what is no longer there.
        patch = {"status": {"lastSyncError": None, **status}}
        self.api.request("PATCH", f"{name}/status", patch, "application/merge-patch+json")
        self._written = wanted
        log.info("SriovNetworkNodeState %s: %s", self.node, status.get("syncStatus"))

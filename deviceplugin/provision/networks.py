"""SriovNetworks kept rendered as NetworkAttachmentDefinitions, as the operator's controller does.

One agent of the cluster does it at a time: the holder of the Lease `plexus-sriov-networks`
(taken like a disruption slot; another agent takes over when it stops renewing). Same rules
as the operator: `networkNamespace` only for a SriovNetwork in the agent's namespace, whose
NAD is then tracked by a finalizer and an annotation naming its last namespace; a NAD in
the network's own namespace is owned by it (the garbage collector removes it); a NAD that
another object owns is left alone; the `Ready` condition says how it went.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from deviceplugin.provision.crs import API_VERSION, CRError, SriovNetwork
from deviceplugin.provision.leases import LeaseSlots
from deviceplugin.provision.nad import OWNER_ANNOTATION, RenderError, nad, target_namespace
from kube.api import APIError, KubeAPI

NETWORKS = "/apis/sriovnetwork.openshift.io/v1/sriovnetworks"
NADS = "/apis/k8s.cni.cncf.io/v1/namespaces/{ns}/network-attachment-definitions"
FINALIZER = "netattdef.finalizers.sriovnetwork.openshift.io"
LAST_NAMESPACE = "operator.sriovnetwork.openshift.io/last-network-namespace"
READY = "NetworkAttachmentDefinition is provisioned and ready"

log = logging.getLogger("plexus.provision")

Json = dict[str, Any]


class NetworkRenderer:
    """Renders every SriovNetwork while this agent holds the renderer Lease."""

    def __init__(
        self, api: KubeAPI, namespace: str, prefix: str, holder: str, lease_seconds: int = 60
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.prefix = prefix
        self.lease = LeaseSlots(api, namespace, "plexus-sriov-networks", holder, lease_seconds)

    def reconcile(self) -> bool:
        """One pass over all SriovNetworks if we lead; False when another agent does."""
        if not self.lease.acquire(1):
            return False
        for obj in self.api.request("GET", NETWORKS).get("items", []):
            try:
                net = SriovNetwork.from_api(obj)
            except CRError as exc:
                log.error("%s", exc)
                continue
            try:
                self._one(net, obj)
            except APIError as exc:
                log.warning("SriovNetwork %s/%s: %s", net.namespace, net.name, exc)
        return True

    def stop(self) -> None:
        self.lease.release()

    def _path(self, net: SriovNetwork) -> str:
        return f"/apis/{API_VERSION}/namespaces/{net.namespace}/sriovnetworks/{net.name}"

    def _one(self, net: SriovNetwork, obj: Json) -> None:
        own = net.namespace == self.namespace
        if net.spec.network_namespace and not own:
            why = (
                "spec.networkNamespace cannot be set when the resource is not in the operator "
                f"namespace ({self.namespace})"
            )
            self._condition(net, obj, False, "NetworkAttachmentDefinitionInvalid", why)
            return
        if net.deleting:
            if FINALIZER in net.finalizers:
                self._delete_nad(target_namespace(net), net.name)
                self._set_finalizers(net, [f for f in net.finalizers if f != FINALIZER])
            return
        if own and FINALIZER not in net.finalizers:
            self._set_finalizers(net, [*net.finalizers, FINALIZER])
        try:
            wanted = nad(net, self.prefix)
        except RenderError as exc:
            self._condition(net, obj, False, "NetworkAttachmentDefinitionInvalid", str(exc))
            return
        target = target_namespace(net)
        last = net.annotations.get(LAST_NAMESPACE)
        if last and last != target:
            self._delete_nad(last, net.name)
            self._annotate(net, "")
        if target == net.namespace:  # the garbage collector's job then
            wanted["metadata"]["ownerReferences"] = [
                {
                    "apiVersion": API_VERSION,
                    "kind": "SriovNetwork",
                    "name": net.name,
                    "uid": net.uid,
                }
            ]
        path = f"{NADS.format(ns=target)}/{net.name}"
        try:
            found = self.api.request("GET", path)
        except APIError as exc:
            if exc.status != 404:
                raise
            found = None
        if found is None:
            if not self._namespace_exists(target):
                why = f'target namespace "{target}" does not exist'
                self._condition(net, obj, False, "NamespaceNotFound", why)
                return
            self.api.request("POST", NADS.format(ns=target), wanted)
            log.info("NetworkAttachmentDefinition %s/%s created", target, net.name)
            self._annotate(net, target)
        else:
            owner = (found["metadata"].get("annotations") or {}).get(OWNER_ANNOTATION, "")
            expected = wanted["metadata"]["annotations"][OWNER_ANNOTATION]
            if owner and owner != expected:
                why = (
                    f"NetworkAttachmentDefinition '{target}/{net.name}' already exists and is "
                    f"owned by {owner}"
                )
                self._condition(net, obj, False, "NetworkAttachmentDefinitionInvalid", why)
                return
            same = found.get("spec") == wanted["spec"] and (
                found["metadata"].get("annotations") == wanted["metadata"]["annotations"]
            )
            if not same:
                wanted["metadata"]["resourceVersion"] = found["metadata"]["resourceVersion"]
                self.api.request("PUT", path, wanted)
                log.info("NetworkAttachmentDefinition %s/%s updated", target, net.name)
        self._condition(net, obj, True, "NetworkReady", READY)

    def _namespace_exists(self, name: str) -> bool:
        try:
            self.api.request("GET", f"/api/v1/namespaces/{name}")
        except APIError as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def _delete_nad(self, namespace: str, name: str) -> None:
        try:
            self.api.request("DELETE", f"{NADS.format(ns=namespace)}/{name}")
        except APIError as exc:
            if exc.status != 404:
                raise

    def _set_finalizers(self, net: SriovNetwork, finalizers: list[str]) -> None:
        patch = {"metadata": {"finalizers": finalizers}}
        self.api.request("PATCH", self._path(net), patch, "application/merge-patch+json")

    def _annotate(self, net: SriovNetwork, namespace: str) -> None:
        patch = {"metadata": {"annotations": {LAST_NAMESPACE: namespace}}}
        self.api.request("PATCH", self._path(net), patch, "application/merge-patch+json")

    def _condition(self, net: SriovNetwork, obj: Json, ok: bool, reason: str, message: str) -> None:
        """Set the Ready condition, unless it already says this."""
        status = "True" if ok else "False"
        found = [
            c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") == "Ready"
        ]
        old = found[0] if found else {}
        same = (old.get("status"), old.get("reason"), old.get("message")) == (
            status,
            reason,
            message,
        )
        if same and old.get("observedGeneration") == net.generation:
            return
        since = old.get("lastTransitionTime") if old.get("status") == status else None
        condition = {
            "type": "Ready",
            "status": status,
            "reason": reason,
            "message": message,
            "observedGeneration": net.generation,
            "lastTransitionTime": since or datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        others = [
            c for c in (obj.get("status") or {}).get("conditions") or [] if c.get("type") != "Ready"
        ]
        patch = {"status": {"conditions": [*others, condition]}}
        self.api.request(
            "PATCH", f"{self._path(net)}/status", patch, "application/merge-patch+json"
        )
        if not ok:
            log.warning("SriovNetwork %s/%s: %s", net.namespace, net.name, message)

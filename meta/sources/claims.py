"""DRA through the API server: a pod's ResourceClaims, their devices' attributes, and the
claims' `status.devices` (KEP-4817 networkData).

As Multus reads them: each of the pod's claims (`spec.resourceClaims`, a template's
generated name from `status.resourceClaimStatuses`) has allocation results naming a
driver, pool and device; the device's ResourceSlice entry carries the attributes
`k8s.cni.cncf.io/resourceName` (matched against a NAD's resourceName) and
`k8s.cni.cncf.io/deviceID` (the ID the NAD's delegate gets), whatever the driver.
Devices without both (a GPU in the same claim) are skipped.

Reads happen only for a pod that has claims, and only when one of its networks has a
resourceName. Each claim is one GET (claims cannot be watched per node, and a cluster's
claims can be many). Device attributes come from an informer over this node's
ResourceSlices, started by the first such pod, which waits for its first list (a node
without DRA pods watches nothing); a device not in it (a pool not bound to this node, or
the informer not synced within the wait) costs one LIST of its driver's slices for the
call. Thin mode, without informers, always LISTs. A device no slice of its driver lists
(a restarted kubelet wiped the node's slices, and the driver has not published them yet)
is code 11: whether it carries the attributes is unknown. The status is one server-side apply on
`resourceclaims/status` with field manager `plexus`, bounded and queued as the
network-status write.
"""

from __future__ import annotations

import functools
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from cni.errors import CNIError, ErrorCode
from kube.api import APIError, KubeAPI, get_object
from kube.informer import Informer
from kube.writes import BackgroundWriter, Write, write_bounded
from meta.sources.base import ClaimDevice, Pod, PodClaim

RESOURCE_NAME_ATTRIBUTE = "k8s.cni.cncf.io/resourceName"
DEVICE_ID_ATTRIBUTE = "k8s.cni.cncf.io/deviceID"
API_VERSION = "resource.k8s.io/v1"
FIELD_MANAGER = "plexus"
GROUP_PATH = "/apis/resource.k8s.io/v1"
SLICE_PATH = f"{GROUP_PATH}/resourceslices"
SLICE_SYNC_SECONDS = 3.0


class DeviceKey(NamedTuple):
    """A device as an allocation result names it."""

    driver: str
    pool: str
    device: str


class DeviceAttributes(NamedTuple):
    """The two Multus attributes of a published device."""

    resource_name: str
    device_id: str


def pod_claims(spec: dict[str, Any], status: dict[str, Any]) -> list[PodClaim]:
    """A pod's `spec.resourceClaims`, each with the ResourceClaim it names."""
    generated = {
        str(s.get("name", "")): s.get("resourceClaimName")
        for s in status.get("resourceClaimStatuses") or []
    }
    claims = []
    for entry in spec.get("resourceClaims") or []:
        name = str(entry.get("name", ""))
        if entry.get("resourceClaimName"):
            claims.append(PodClaim(name=name, claim=str(entry["resourceClaimName"])))
        elif entry.get("resourceClaimTemplateName"):
            made = (generated[name] or "") if name in generated else None
            claims.append(PodClaim(name=name, claim=made, template=True))
    return claims


def slice_attributes(obj: dict[str, Any]) -> dict[str, DeviceAttributes | None]:
    """Device name -> Multus attributes for each device of a ResourceSlice (None for a
    device that has not both)."""
    found: dict[str, DeviceAttributes | None] = {}
    for device in (obj.get("spec") or {}).get("devices") or []:
        attrs = device.get("attributes") or {}
        resource = (attrs.get(RESOURCE_NAME_ATTRIBUTE) or {}).get("string")
        device_id = (attrs.get(DEVICE_ID_ATTRIBUTE) or {}).get("string")
        both = DeviceAttributes(str(resource), str(device_id)) if resource and device_id else None
        found[str(device.get("name", ""))] = both
    return found


def allocated_devices(
    obj: dict[str, Any], where: str, lookup: Callable[[DeviceKey], DeviceAttributes | None]
) -> list[ClaimDevice]:
    """The devices of a ResourceClaim's allocation that carry the Multus attributes.

    `where` names the claim in errors; `lookup` finds a device's attributes (None for a
    device that has not both).
    """
    meta = obj.get("metadata") or {}
    allocation = (obj.get("status") or {}).get("allocation")
    results = ((allocation or {}).get("devices") or {}).get("results")
    if not results:
        raise CNIError(
            ErrorCode.TRY_AGAIN_LATER,
            f"{where} is not allocated",
            "the scheduler allocates a claim before the pod runs; the kubelet retries",
        )
    devices = []
    for result in results:
        key = DeviceKey(str(result["driver"]), str(result["pool"]), str(result["device"]))
        attrs = lookup(key)
        if attrs is not None:
            devices.append(
                ClaimDevice(
                    namespace=str(meta.get("namespace", "")),
                    claim=str(meta.get("name", "")),
                    uid=str(meta.get("uid", "")),
                    driver=key.driver,
                    pool=key.pool,
                    device=key.device,
                    share_id=str(result.get("shareID") or ""),
                    resource_name=attrs.resource_name,
                    device_id=attrs.device_id,
                )
            )
    return devices


def apply_body(
    namespace: str, claim: str, uid: str, devices: list[dict[str, Any]]
) -> dict[str, Any]:
    """The server-side apply object for a claim's status; the UID makes a newer claim of
    the same name refuse it."""
    metadata = {"name": claim, "namespace": namespace, **({"uid": uid} if uid else {})}
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": metadata,
        "status": {"devices": devices},
    }


@dataclass
class NodeSlice:
    """A ResourceSlice reduced to what attachment needs: its devices' Multus attributes."""

    name: str
    driver: str
    pool: str
    devices: dict[str, DeviceAttributes | None]
    namespace: str = ""  # slices are cluster-scoped


def _node_slice(obj: dict[str, Any]) -> NodeSlice:
    spec = obj.get("spec") or {}
    return NodeSlice(
        name=str((obj.get("metadata") or {}).get("name", "")),
        driver=str(spec.get("driver", "")),
        pool=str((spec.get("pool") or {}).get("name", "")),
        devices=slice_attributes(obj),
    )


class KubeClaims:
    """ClaimSource backed by the API server."""

    def __init__(
        self,
        api: KubeAPI,
        node_name: str,
        write_timeout: float,
        writer: BackgroundWriter | None,
        watch_slices: bool,
    ) -> None:
        self.api = api
        self.node_name = node_name
        self.write_timeout = write_timeout
        self.writer = writer
        self.slices: Informer[NodeSlice] | None = None
        self._watch_slices = watch_slices and bool(node_name)
        self._lock = threading.Lock()

    def stop(self) -> None:
        if self.slices is not None:
            self.slices.stop()

    # ---- reads ---------------------------------------------------------------

    def claim_devices(self, pod: Pod) -> list[ClaimDevice]:
        self._start_slices()
        listed: dict[str, list[NodeSlice]] = {}  # driver -> its slices, LISTed for this call
        devices = []
        for entry in pod.resource_claims:
            claim = self._claim_name(pod, entry)
            if not claim:
                continue  # the controller reported that this entry needs no claim
            where = (
                f"ResourceClaim {pod.namespace}/{claim} (claim {entry.name!r} of pod {pod.name})"
            )
            obj = get_object(
                self.api, f"{GROUP_PATH}/namespaces/{pod.namespace}/resourceclaims/{claim}"
            )
            if obj is None:
                raise CNIError(
                    ErrorCode.TRY_AGAIN_LATER,
                    f"{where} does not exist",
                    "the kubelet starts a pod only once its claims exist; retry",
                )
            devices += allocated_devices(obj, where, functools.partial(self._lookup, where, listed))
        return devices

    def _lookup(
        self, where: str, listed: dict[str, list[NodeSlice]], key: DeviceKey
    ) -> DeviceAttributes | None:
        """The device's Multus attributes (None: it has not both); CNIError when no slice
        of its driver lists it, since whether it carries them is then unknown."""
        found = self._cached(key)
        if found is None:
            if key.driver not in listed:
                listed[key.driver] = self._list_driver(key.driver)
            found = _slice_of(listed[key.driver], key)
        if found is None:
            raise CNIError(
                ErrorCode.TRY_AGAIN_LATER,
                f"{where}: device {key.device} of pool {key.pool} ({key.driver}) is in no "
                "ResourceSlice",
                "a restarted kubelet deletes its node's slices until the driver publishes "
                "them again; retry",
            )
        return found.devices[key.device]

    @staticmethod
    def _claim_name(pod: Pod, entry: PodClaim) -> str:
        if entry.claim is None:
            raise CNIError(
                ErrorCode.TRY_AGAIN_LATER,
                f"pod {pod.namespace}/{pod.name}: no ResourceClaim generated yet for claim "
                f"{entry.name!r} (its status.resourceClaimStatuses has no entry)",
                "the resourceclaim controller generates it from the template; retry",
            )
        return entry.claim

    def _start_slices(self) -> None:
        with self._lock:
            if self.slices is None and self._watch_slices:
                query = {"fieldSelector": f"spec.nodeName={self.node_name}"}
                self.slices = Informer(self.api, SLICE_PATH, query, _node_slice)
                self.slices.start()
        if self.slices is not None:
            self.slices.synced.wait(SLICE_SYNC_SECONDS)

    def _cached(self, key: DeviceKey) -> NodeSlice | None:
        """The watched slice that publishes the device, if the informer has it."""
        if self.slices is None or not self.slices.synced.is_set():
            return None
        return _slice_of(list(self.slices.items.values()), key)

    def _list_driver(self, driver: str) -> list[NodeSlice]:
        query = urllib.parse.urlencode({"fieldSelector": f"spec.driver={driver}"})
        try:
            body = self.api.request("GET", f"{SLICE_PATH}?{query}")
        except (APIError, OSError) as exc:
            raise CNIError(
                ErrorCode.TRY_AGAIN_LATER,
                f"listing the ResourceSlices of {driver} failed",
                str(exc),
            ) from exc
        return [_node_slice(obj) for obj in body.get("items", [])]

    # ---- writes --------------------------------------------------------------

    def set_device_status(
        self, namespace: str, claim: str, uid: str, devices: list[dict[str, Any]]
    ) -> None:
        query = urllib.parse.urlencode({"fieldManager": FIELD_MANAGER, "force": "true"})
        path = f"{GROUP_PATH}/namespaces/{namespace}/resourceclaims/{claim}/status?{query}"
        body = apply_body(namespace, claim, uid, devices)

        def send(timeout: float) -> None:
            self.api.request(
                "PATCH", path, body, content_type="application/apply-patch+yaml", timeout=timeout
            )

        what = f"status.devices of ResourceClaim {namespace}/{claim}"
        write = Write("status", what, send)
        write_bounded(write, ("claim", namespace, claim), self.write_timeout, self.writer)


def _slice_of(slices: list[NodeSlice], key: DeviceKey) -> NodeSlice | None:
    """The slice of the device's driver and pool that lists the device."""
    for found in slices:
        if found.driver == key.driver and found.pool == key.pool and key.device in found.devices:
            return found
    return None

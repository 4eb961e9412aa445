"""Devices a pod holds through DRA ResourceClaims, and the claim status written for them.

As Multus reads them: each of the pod's claims (`spec.resourceClaims`, a template's
generated name from `status.resourceClaimStatuses`) has allocation results naming a
driver, pool and device; the device's ResourceSlice entry carries the attributes
`k8s.cni.cncf.io/resourceName` (matched against a NAD's resourceName) and
`k8s.cni.cncf.io/deviceID` (the ID the NAD's delegate gets), whatever the driver.
Devices without both (a GPU in the same claim) are skipped. After ADD, each claim whose
device got attached gets `status.devices[]` with a Ready condition and KEP-4817
`networkData` (interface name, CIDRs, MAC).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, NamedTuple

from cni.errors import CNIError, ErrorCode
from cni.result import Result
from meta.delegate import Delegate
from meta.devices import DeviceSource
from meta.sources.base import ClaimDevice, ClaimSource, Pod, PodClaim

RESOURCE_NAME_ATTRIBUTE = "k8s.cni.cncf.io/resourceName"
DEVICE_ID_ATTRIBUTE = "k8s.cni.cncf.io/deviceID"
API_VERSION = "resource.k8s.io/v1"
FIELD_MANAGER = "plexus"
READY_REASON = "NetworkAttached"


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


class ClaimedDevices:
    """A pod's device IDs: from its claims' devices for a resource any of them carries,
    else from `fallback` (the device plugin's, through the kubelet).

    The claims are read once, when the first network with a resourceName asks.
    """

    def __init__(self, source: ClaimSource, pod: Pod, fallback: DeviceSource | None) -> None:
        self.source = source
        self.pod = pod
        self.fallback = fallback
        self._devices: list[ClaimDevice] | None = None

    def devices(self) -> list[ClaimDevice]:
        if self._devices is None:
            self._devices = self.source.claim_devices(self.pod)
        return self._devices

    def device_ids(self, namespace: str, pod: str, uid: str, resource: str) -> list[str]:
        mine = [d.device_id for d in self.devices() if d.resource_name == resource]
        if mine or self.fallback is None:
            return mine
        return self.fallback.device_ids(namespace, pod, uid, resource)

    def attached(
        self, delegates: Iterable[Delegate], results: Iterable[Result]
    ) -> list[tuple[ClaimDevice, Delegate, Result]]:
        """The claim devices the ADD attached, with their attachment and its result."""
        if self._devices is None:
            return []
        by_id = {d.device_id: d for d in self._devices}
        return [
            (by_id[delegate.device_id], delegate, result)
            for delegate, result in zip(delegates, results, strict=True)
            if delegate.device_id in by_id
        ]


def device_status(device: ClaimDevice, delegate: Delegate, result: Result) -> dict[str, Any]:
    """The claim's `status.devices` entry for an attached device (resource.k8s.io/v1)."""
    index = next(
        (
            i
            for i, iface in enumerate(result.interfaces)
            if iface.sandbox and iface.name == delegate.ifname
        ),
        None,
    )
    mac = result.interfaces[index].mac if index is not None else ""
    cidrs = [str(ip.address) for ip in result.ips if ip.interface in (None, index)]
    network: dict[str, Any] = {"interfaceName": delegate.ifname}
    if cidrs:
        network["ips"] = cidrs
    if mac:
        network["hardwareAddress"] = mac
    entry: dict[str, Any] = {
        "driver": device.driver,
        "pool": device.pool,
        "device": device.device,
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": READY_REASON,
                "message": f"attached as {delegate.ifname} by network {delegate.network}",
                "lastTransitionTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            }
        ],
        "networkData": network,
    }
    if device.share_id:
        entry["shareID"] = device.share_id
    return entry


def status_by_claim(
    attached: list[tuple[ClaimDevice, Delegate, Result]],
) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    """(namespace, claim, uid) -> the `status.devices` entries to apply to that claim."""
    grouped: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for device, delegate, result in attached:
        key = (device.namespace, device.claim, device.uid)
        grouped.setdefault(key, []).append(device_status(device, delegate, result))
    return grouped


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

"""The engine's side of DRA: the device IDs a pod holds through its ResourceClaims, and
the claim status written for the devices an ADD attached.

How claims and their devices are read (as Multus reads them) is meta/sources/claims.py.
After ADD, each claim whose device got attached gets `status.devices[]` with a Ready
condition and KEP-4817 `networkData` (interface name, CIDRs, MAC).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from cni.result import Result
from meta.delegate import Delegate
from meta.devices import DeviceSource
from meta.sources.base import ClaimDevice, ClaimSource, Pod

READY_REASON = "NetworkAttached"


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

"""Device IDs for networks whose NAD names a device-plugin resource (Multus's resourceName).

The pod's IDs for a resource are sorted, and each network using that resource takes
the next one not yet taken, in attach order; IDs a selection names explicitly are
never handed out to another network.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from cni.errors import CNIError, ErrorCode
from meta.sources.base import Pod


class DeviceSource(Protocol):
    """Where a pod's allocated device IDs come from (the kubelet, or a test double)."""

    def device_ids(self, namespace: str, pod: str, uid: str, resource: str) -> list[str]:
        """The device IDs of `resource` allocated to the pod; empty if none."""
        ...


class DeviceAllocator:
    """Hands out one pod's device IDs, each once; asks the source once per resource."""

    def __init__(self, source: DeviceSource, pod: Pod, reserved: Iterable[str] = ()) -> None:
        self.source = source
        self.pod = pod
        self.reserved = set(reserved)
        self._pools: dict[str, list[str]] = {}
        self._taken: dict[str, set[str]] = {}

    def allocated(self, resource: str) -> list[str]:
        """The pod's device IDs of `resource`, sorted (asked once per resource)."""
        pool = self._pools.get(resource)
        if pool is None:
            ids = self.source.device_ids(self.pod.namespace, self.pod.name, self.pod.uid, resource)
            pool = self._pools[resource] = sorted(set(ids))
        return pool

    def take(self, resource: str, network: str) -> str:
        """The next free device ID of `resource` for `network`; an error if none is left."""
        pool = self.allocated(resource)
        taken = self._taken.setdefault(resource, set())
        for device_id in pool:
            if device_id not in taken and device_id not in self.reserved:
                taken.add(device_id)
                return device_id
        held = ", ".join(pool) if pool else "none"
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            f"network {network}: no {resource} device left for pod "
            f"{self.pod.namespace}/{self.pod.name} (allocated: {held}; "
            f"{len(taken)} taken by earlier networks)",
            "request one unit of the resource per network that uses it in the pod's "
            "resources.limits, or a device through a ResourceClaim whose "
            f"k8s.cni.cncf.io/resourceName attribute is {resource}",
        )

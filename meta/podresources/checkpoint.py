"""The kubelet device manager's checkpoint file, read when PodResources is unreachable.

`/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint` is JSON:
`{"Data": {"PodDeviceEntries": [{PodUID, ContainerName, ResourceName, DeviceIDs,
AllocResp}], "RegisteredDevices": {...}}, "Checksum": N}`. `DeviceIDs` is a list in
old kubelets and a map of NUMA node -> list since topology-aware allocation.
"""

from __future__ import annotations

from typing import Any

from cni import jsonio
from cni.errors import CNIError, ErrorCode

DEFAULT_CHECKPOINT = "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"


def _ids(raw: Any) -> list[str]:
    if isinstance(raw, list):
        return [str(i) for i in raw]
    if isinstance(raw, dict):
        return [str(i) for ids in raw.values() if isinstance(ids, list) for i in ids]
    return []


def pod_devices(
    text: str | bytes, uid: str, origin: str = DEFAULT_CHECKPOINT
) -> dict[str, set[str]]:
    """Resource name -> device IDs allocated to any container of the pod with this UID."""
    return all_pod_devices(text, origin).get(uid, {})


def all_pod_devices(
    text: str | bytes, origin: str = DEFAULT_CHECKPOINT
) -> dict[str, dict[str, set[str]]]:
    """Pod UID -> resource name -> device IDs, for every pod the checkpoint holds."""
    try:
        data = jsonio.loads(text, origin)
        entries = data["Data"]["PodDeviceEntries"] or []
    except (ValueError, TypeError, KeyError) as exc:
        raise CNIError(
            ErrorCode.DECODE_FAILURE, f"{origin}: not a device manager checkpoint", str(exc)
        ) from exc
    found: dict[str, dict[str, set[str]]] = {}
    for entry in entries:
        if not isinstance(entry, dict) or not entry.get("PodUID"):
            continue
        pod = found.setdefault(str(entry["PodUID"]), {})
        resource = str(entry.get("ResourceName", ""))
        pod.setdefault(resource, set()).update(_ids(entry.get("DeviceIDs")))
    return found

"""DRA through the API server: a pod's ResourceClaims, their devices' attributes, and the
claims' `status.devices` (KEP-4817 networkData).

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
from dataclasses import dataclass
from typing import Any

from cni.errors import CNIError, ErrorCode
from kube.api import APIError, KubeAPI, get_object
from kube.informer import Informer
from kube.writes import BackgroundWriter, Write, write_bounded
from meta.claims import (
    FIELD_MANAGER,
    DeviceAttributes,
    DeviceKey,
    allocated_devices,
    apply_body,
    slice_attributes,
)
from meta.sources.base import ClaimDevice, Pod, PodClaim

GROUP_PATH = "/apis/resource.k8s.io/v1"
SLICE_PATH = f"{GROUP_PATH}/resourceslices"
SLICE_SYNC_SECONDS = 3.0


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

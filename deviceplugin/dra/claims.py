"""ResourceClaims of this node's pods, read before the kubelet asks to prepare them.

A watch of the node's pods (fieldSelector spec.nodeName, as the kubelet's own) sees a
pod once it is bound, which the scheduler does only after writing its claims'
allocation and reservation; so a consistent GET of each claim the pod names, made then,
reads the claim as allocated for that pod, off NodePrepareResources' path. Prepare
`take`s such a copy only while that pod is still on the node and alive (a claim's
allocation cannot change while it is reserved), once; anything else (a claim allocated
after the bind, a copy not reserved for the pod, a pod our watch has not shown within
WAIT_SECONDS) is a miss, and Prepare reads the claim itself as before.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from deviceplugin.dra.slices import DRIVER
from kube.api import APIError, KubeAPI
from kube.informer import Informer

Json = dict[str, Any]
WAIT_SECONDS = 2.0  # for our pod watch to show a pod the kubelet already saw
MAX_ENTRIES = 1024  # copies of pods deleted before their Prepare are dropped oldest first
TERMINAL = frozenset({"Succeeded", "Failed"})

log = logging.getLogger("plexus.deviceplugin")


@dataclass
class PodClaims:
    """What the cache needs of one pod: who it is, whether it runs on, its claims' names."""

    namespace: str
    name: str
    uid: str
    terminal: bool
    claims: tuple[str, ...]


def pod_claims(pod: Json) -> PodClaims:
    meta, spec, status = pod.get("metadata", {}), pod.get("spec", {}), pod.get("status") or {}
    generated = {
        s.get("name"): s.get("resourceClaimName") for s in status.get("resourceClaimStatuses") or []
    }
    names = []
    for ref in spec.get("resourceClaims") or []:
        name = ref.get("resourceClaimName") or generated.get(ref.get("name"))
        if name:
            names.append(str(name))
    return PodClaims(
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid", "")),
        terminal=status.get("phase") in TERMINAL,
        claims=tuple(names),
    )


def reserved_for(claim: Json, pod_uid: str) -> bool:
    status = claim.get("status") or {}
    return any(r.get("uid") == pod_uid for r in status.get("reservedFor") or [])


def has_our_devices(claim: Json) -> bool:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return any(r.get("driver") == DRIVER for r in results)


@dataclass(frozen=True)
class _Copy:
    pod: PodClaims
    claim: Json | None  # None: nothing to use
    reading: bool = False


class ClaimCache:
    """Prefetched claims of the node's pods, by (namespace, claim name)."""

    def __init__(self, api: KubeAPI, node_name: str) -> None:
        self.api = api
        self.pods = Informer(
            api, "/api/v1/pods", {"fieldSelector": f"spec.nodeName={node_name}"}, pod_claims
        )
        self.pods.listeners.append(self._pod_changed)
        self._copies: OrderedDict[tuple[str, str], _Copy] = OrderedDict()
        self._changed = threading.Condition()
        self._reads: queue.Queue[PodClaims | None] = queue.Queue()
        self._worker = threading.Thread(target=self._read_loop, name="dra-claims", daemon=True)

    def start(self) -> None:
        self._worker.start()
        self.pods.start()

    def stop(self) -> None:
        self.pods.stop()
        self._reads.put(None)

    def take(self, namespace: str, name: str, uid: str) -> Json | None:
        """The prefetched claim `name` if it has this UID and its pod still runs here."""
        key = (namespace, name)
        with self._changed:
            if self.pods.synced.is_set():
                self._changed.wait_for(
                    lambda: (c := self._copies.get(key)) is not None and not c.reading,
                    WAIT_SECONDS,
                )
            copy = self._copies.get(key)
            if copy is None or copy.claim is None or copy.reading:
                return None
            # One Prepare per read: the state file answers the kubelet's repeats.
            self._copies[key] = _Copy(copy.pod, None)
        pod = self.pods.get(copy.pod.namespace, copy.pod.name)
        if pod is None or pod.uid != copy.pod.uid or pod.terminal:
            return None
        if copy.claim.get("metadata", {}).get("uid") != uid:
            return None
        return copy.claim

    def _pod_changed(self, old: PodClaims | None, new: PodClaims) -> None:
        if new.terminal or not new.claims:
            return
        if old is not None and (old.uid, old.claims) == (new.uid, new.claims):
            return
        with self._changed:
            for claim in new.claims:
                self._put((new.namespace, claim), _Copy(new, None, reading=True))
        self._reads.put(new)

    def _read_loop(self) -> None:
        while (pod := self._reads.get()) is not None:
            for name in pod.claims:
                copy = _Copy(pod, self._read(pod, name))
                key = (pod.namespace, name)
                with self._changed:
                    current = self._copies.get(key)
                    if current is not None and current.pod == pod:  # else a newer pod's
                        self._put(key, copy)
                    self._changed.notify_all()

    def _read(self, pod: PodClaims, name: str) -> Json | None:
        path = f"/apis/resource.k8s.io/v1/namespaces/{pod.namespace}/resourceclaims/{name}"
        try:
            claim = self.api.request("GET", path)  # consistent: after the pod's bind
        except (APIError, ConnectionError) as exc:
            log.warning("prefetch of claim %s/%s: %s", pod.namespace, name, exc)
            return None
        return claim if reserved_for(claim, pod.uid) and has_our_devices(claim) else None

    def _put(self, key: tuple[str, str], copy: _Copy) -> None:
        self._copies[key] = copy
        self._copies.move_to_end(key)
        while len(self._copies) > MAX_ENTRIES:
            self._copies.popitem(last=False)

"""Keep this node's ResourceSlices in the API equal to its pools.

`set_pools` hands in what discovery found; a background thread then makes the API agree
(create, update or delete our slices, found by `spec.nodeName` and `spec.driver`). A
second thread watches those slices: the kubelet deletes every slice of its node when it
starts (and a driver's slices when its plugin has been gone a while), and a deleted or
changed slice wakes the first thread, which publishes again. A full reconcile also runs
every `resync_seconds`. A pool whose devices change gets a higher `generation` than any
of its slices in the API, so the scheduler never mixes old and new slices of a pool.
"""

from __future__ import annotations

import logging
import threading
import urllib.parse
from collections.abc import Mapping, Sequence
from typing import Any

from deviceplugin.dra.slices import DRIVER, node_slices
from deviceplugin.sysfs import PciNetDevice
from kube.api import APIError, KubeAPI, Stop

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
WATCH_SECONDS = 300
RETRY_SECONDS = 1.0

log = logging.getLogger("plexus.deviceplugin")

Json = dict[str, Any]


def _content(slice_: Json) -> Json:
    """What decides whether a slice in the API is current: all but its generation."""
    spec = slice_.get("spec", {})
    pool = {k: v for k, v in spec.get("pool", {}).items() if k != "generation"}
    owners = [
        {k: o.get(k) for k in ("kind", "name", "uid")}
        for o in slice_.get("metadata", {}).get("ownerReferences", [])
    ]
    return {
        "driver": spec.get("driver"),
        "nodeName": spec.get("nodeName"),
        "pool": pool,
        "devices": spec.get("devices") or [],  # the API leaves out an empty list
        "owners": owners,
    }


class SlicePublisher:
    """Publishes this node's slices until `stop`; `set_pools` says what they hold."""

    def __init__(self, api: KubeAPI, node: str, resync_seconds: float = 30.0) -> None:
        self.api = api
        self.node = node
        self.resync_seconds = resync_seconds
        self.selector = urllib.parse.urlencode(
            {"fieldSelector": f"spec.nodeName={node},spec.driver={DRIVER}"}
        )
        self._pools: dict[str, list[PciNetDevice]] | None = None
        self._node_uid = ""
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = Stop()
        self.published = threading.Event()  # set after the first reconcile that succeeded
        self._threads = [
            threading.Thread(target=self._reconcile_loop, name="dra-slices", daemon=True),
            threading.Thread(target=self._watch_loop, name="dra-slices-watch", daemon=True),
        ]

    def set_pools(self, pools: Mapping[str, Sequence[PciNetDevice]]) -> None:
        with self._lock:
            fresh = {name: list(devices) for name, devices in pools.items()}
            if fresh == self._pools:
                return
            self._pools = fresh
        self._wake.set()

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        """Stop publishing; the slices stay (an upgraded instance takes them over)."""
        self._stop.set()
        self._wake.set()
        self._threads[0].join()

    # -- reconcile ---------------------------------------------------------------------

    def _reconcile_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.resync_seconds)
            if self._stop.is_set():
                return
            self._wake.clear()
            try:
                self.reconcile()
            except (APIError, ConnectionError) as exc:
                log.warning("ResourceSlices of %s not published (retrying): %s", self.node, exc)
                self._stop.wait(RETRY_SECONDS)
                self._wake.set()

    def _uid(self) -> str:
        if not self._node_uid:
            node = self.api.request("GET", f"/api/v1/nodes/{self.node}")
            self._node_uid = str(node["metadata"]["uid"])
        return self._node_uid

    def reconcile(self) -> int:
        """Make the API hold exactly our slices; returns how many writes that took."""
        with self._lock:
            pools = self._pools
        if pools is None:
            return 0  # no discovery yet
        existing = {
            s["metadata"]["name"]: s
            for s in self.api.request("GET", f"{SLICES}?{self.selector}").get("items", [])
        }
        wanted = node_slices(self.node, self._uid(), pools, {})
        generations = self._generations(wanted, existing)
        writes = 0
        for name, slice_ in wanted.items():
            pool = slice_["spec"]["pool"]["name"]
            if pool not in generations:
                continue
            slice_["spec"]["pool"]["generation"] = generations[pool]
            old = existing.get(name)
            if old is None:
                self.api.request("POST", SLICES, slice_)
            else:
                slice_["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
                self.api.request("PUT", f"{SLICES}/{name}", slice_)
            writes += 1
        for name in existing.keys() - wanted.keys():
            try:
                self.api.request("DELETE", f"{SLICES}/{name}")
            except APIError as exc:
                if exc.status != 404:
                    raise
            writes += 1
        if writes:
            log.info("ResourceSlices of %s: %d written or deleted", self.node, writes)
        self.published.set()
        return writes

    @staticmethod
    def _generations(wanted: Mapping[str, Json], existing: Mapping[str, Json]) -> dict[str, int]:
        """The new generation of each pool that needs writing (pools that are current
        are left out): one above the highest the API has for that pool."""
        by_pool: dict[str, list[str]] = {}
        for name, slice_ in wanted.items():
            by_pool.setdefault(slice_["spec"]["pool"]["name"], []).append(name)
        highest: dict[str, int] = {}
        for slice_ in existing.values():
            pool = slice_["spec"]["pool"]
            highest[pool["name"]] = max(highest.get(pool["name"], 0), int(pool["generation"]))
        stale: dict[str, int] = {}
        for pool, names in by_pool.items():
            current = [existing.get(n) for n in names]
            gens = {int(s["spec"]["pool"]["generation"]) for s in current if s is not None}
            same = all(
                s is not None and _content(s) == _content(wanted[n])
                for n, s in zip(names, current, strict=True)
            )
            if not same or len(gens) != 1:
                stale[pool] = highest.get(pool, 0) + 1
        return stale

    # -- watch -------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        url = f"{SLICES}?{self.selector}&watch=1&timeoutSeconds={WATCH_SECONDS}"
        while not self._stop.is_set():
            try:
                for event in self.api.watch(url, WATCH_SECONDS, self._stop):
                    if self._stop.is_set():
                        return
                    if event.get("type") in ("DELETED", "MODIFIED", "ERROR"):
                        self._wake.set()
                self._wake.set()  # the server ended the watch: catch up on what it missed
            except (APIError, ConnectionError, ValueError) as exc:
                if self._stop.is_set():
                    return
                log.warning("watching ResourceSlices of %s: %s", self.node, exc)
                self._stop.wait(RETRY_SECONDS)
                self._wake.set()  # events may have been missed

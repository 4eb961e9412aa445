"""IPPools and OverlappingRangeIPReservations on the API server, in whereabouts' format.

A pool is `IPPool` `<name>` in the store's namespace: `spec.range` and `spec.allocations`
(offset -> `{id, podref, ifname}`). Reads come from a watch of the namespace's pools, or
from the answer to this process's own last write when that is newer (resourceVersions
compared as the integers the API server hands out). Writes are JSON patches that hold only
if the pool still agrees with what the write assumed: an allocation tests that its offset
is still absent, a release that the entry is still the one it read. The API server applies
a patch to the pool as stored, atomically, so two writers never lose each other's
allocations; a failed test (HTTP 422) means someone took the address first. whereabouts'
own writes (a JSON patch with a resourceVersion test) interleave with these safely.

Reservations (one per allocated address, named after it) are created and deleted whole:
a create that finds one (409) means the address is held in an overlapping range. Plexus
labels its reservations with the node that made them and annotates the pool, so GC and a
dead node's release can find them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlencode

from cni.errors import CNIError, ErrorCode
from delegates.ipam.whereabouts.batches import Batches, Busy, Change
from delegates.ipam.whereabouts.objects import GROUP_VERSION, Allocation, Pool, Taken
from kube.api import APIError, KubeAPI
from kube.informer import Informer
from kube.writes import retriable

log = logging.getLogger("plexus.ipam")

JSON_PATCH = "application/json-patch+json"


class PoolStore:
    """The pools and reservations of one namespace."""

    def __init__(self, api: KubeAPI, namespace: str, watch: bool = True) -> None:
        self.api = api
        self.namespace = namespace
        self.base = f"/apis/{GROUP_VERSION}/namespaces/{namespace}"
        self.informer: Informer[Pool] | None = None
        if watch:
            self.informer = Informer(api, f"{self.base}/ippools", {}, Pool.read)
        self._written: dict[str, Pool] = {}
        self._batches = Batches(self._send, self.refresh)
        self._inflight: dict[str, set[int]] = {}
        self._watching = False
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start watching the namespace's pools (once; get() starts it when a shared pool
        is first read: a node-slice network's pools are this node's own and need none)."""
        with self._lock:
            if self.informer is None or self._watching:
                return
            self._watching = True
        self.informer.start()

    def stop(self) -> None:
        if self.informer is not None:
            self.informer.stop()

    def pools(self) -> list[Pool]:
        """Every pool known (the watch's, with this process's newer writes)."""
        with self._lock:
            known = dict(self._written)
        if self.informer is not None:
            for (_, name), pool in list(self.informer.items.items()):
                mine = known.get(name)
                if mine is None or pool.newer_than(mine):
                    known[name] = pool
        return list(known.values())

    # ---- pools ---------------------------------------------------------------

    def get(self, name: str, cidr: str, create: bool = True, shared: bool = True) -> Pool | None:
        """The pool as last seen; read from the API server when the watch has not synced,
        created (empty) when it does not exist and `create` is set. A `shared` pool (other
        nodes write it) starts the watch."""
        if shared:
            self.start()
        cached = self._cached(name)
        if cached is not None:
            return cached
        informer = self.informer
        if informer is None or not informer.synced.is_set():
            pool = self.refresh(name)
            if pool is not None:
                return pool
        if not create:
            return None
        return self._create(name, cidr)

    def refresh(self, name: str) -> Pool | None:
        """The pool as the API server has it now (None if it does not exist)."""
        obj = self._call("GET", f"{self.base}/ippools/{name}", missing_ok=True)
        if obj is None:
            self._forget(name)
            return None
        return self._remember(Pool.read(obj))

    def _cached(self, name: str) -> Pool | None:
        with self._lock:
            mine = self._written.get(name)
        seen = self.informer.get(self.namespace, name) if self.informer is not None else None
        if seen is None:
            return mine
        if mine is None or not mine.newer_than(seen):
            if mine is not None:
                self._forget(name, mine)
            return seen
        return mine

    def _create(self, name: str, cidr: str) -> Pool:
        body = {
            "apiVersion": GROUP_VERSION,
            "kind": "IPPool",
            "metadata": {"name": name},
            "spec": {"range": cidr, "allocations": {}},
        }
        try:
            obj = self._call("POST", f"{self.base}/ippools", body, taken=(409,))
        except Taken:  # made by someone else meanwhile
            pool = self.refresh(name)
            if pool is None:
                raise CNIError(
                    ErrorCode.TRY_AGAIN_LATER, f"IPPool {name} was created and deleted at once"
                ) from None
            return pool
        assert obj is not None
        return self._remember(Pool.read(obj))

    def add(self, pool: Pool, key: str, entry: Allocation) -> Pool:
        """Write `entry` at `key` if the key is still free; Taken if it is not."""
        return self.write(pool.name, Change(key, None, entry.body()))

    def put(self, pool: Pool, key: str, entry: Allocation) -> Pool:
        """Write `entry` at `key` if the key still holds what `pool` shows; Taken if not."""
        return self.write(pool.name, Change(key, pool.allocations.get(key), entry.body()))

    def remove(self, pool: Pool, key: str) -> Pool:
        """Drop the allocation at `key` if it is still the one `pool` holds; Taken if not."""
        return self.write(pool.name, Change(key, pool.allocations[key], None))

    def list_pools(self) -> list[Pool]:
        """Every pool of the namespace, read now."""
        found = self._call("GET", f"{self.base}/ippools") or {}
        return [Pool.read(obj) for obj in found.get("items") or [] if isinstance(obj, dict)]

    def write(self, name: str, change: Change) -> Pool:
        """Apply one change to pool `name`; Taken if its key no longer holds `before`."""
        try:
            return self._batches.write(name, change)
        except Taken:
            self._forget(name)
            raise

    def _send(self, name: str, ops: list[dict[str, Any]]) -> Pool | None:
        """One patch of pool `name` (Batches' `send`)."""
        path = f"{self.base}/ippools/{name}"
        try:
            obj = self._call("PATCH", path, ops, JSON_PATCH, True, (409, 422))
        except Taken as exc:
            cause = exc.__cause__
            if isinstance(cause, APIError) and cause.status == 409:
                raise Busy(str(cause)) from cause
            raise
        if obj is None:  # deleted since it was read
            self._forget(name)
            return None
        return self._remember(Pool.read(obj))

    def _remember(self, pool: Pool) -> Pool:
        with self._lock:
            known = self._written.get(pool.name)
            if known is None or pool.newer_than(known) or known is pool:
                self._written[pool.name] = pool
        return pool

    def _forget(self, name: str, only: Pool | None = None) -> None:
        with self._lock:
            if only is None or self._written.get(name) is only:
                self._written.pop(name, None)

    @contextmanager
    def picking(self, name: str, pick: Callable[[set[int]], int | None]) -> Iterator[int | None]:
        """Run `pick` with the addresses other calls of this process are writing to pool
        `name` now, and hold the one it picks until the block ends: concurrent ADDs on one
        node choose different addresses instead of racing for one."""
        with self._lock:
            busy = self._inflight.setdefault(name, set())
            value = pick(busy)
            if value is not None:
                busy.add(value)
        try:
            yield value
        finally:
            if value is not None:
                with self._lock:
                    busy.discard(value)
                    if not busy:
                        self._inflight.pop(name, None)

    # ---- reservations ----------------------------------------------------------

    def reserve(
        self,
        name: str,
        spec: dict[str, str],
        labels: dict[str, str],
        annotations: dict[str, str],
    ) -> dict[str, Any]:
        """Create reservation `name`; Taken if it exists."""
        body = {
            "apiVersion": GROUP_VERSION,
            "kind": "OverlappingRangeIPReservation",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": spec,
        }
        obj = self._call("POST", f"{self.base}/overlappingrangeipreservations", body, taken=(409,))
        assert obj is not None
        return obj

    def reservation(self, name: str) -> dict[str, Any] | None:
        return self._call(
            "GET", f"{self.base}/overlappingrangeipreservations/{name}", missing_ok=True
        )

    def unreserve(self, obj: dict[str, Any]) -> None:
        """Delete the reservation `obj` if it is still that object (uid and version)."""
        meta = obj.get("metadata") or {}
        body = {
            "preconditions": {
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            }
        }
        path = f"{self.base}/overlappingrangeipreservations/{meta.get('name', '')}"
        try:
            self._call("DELETE", path, body, missing_ok=True, taken=(409,))
        except Taken:
            log.info("reservation changed before its delete; left", extra={"name": path})

    def relabel(self, name: str, spec: dict[str, str], labels: dict[str, str | None]) -> None:
        """Merge `spec` and `labels` (None removes one) into reservation `name`."""
        body = {"metadata": {"labels": labels}, "spec": spec}
        path = f"{self.base}/overlappingrangeipreservations/{name}"
        self._call("PATCH", path, body, "application/merge-patch+json", missing_ok=True)

    def reservations(self, selector: str) -> list[dict[str, Any]]:
        """The reservations matching label selector `selector`."""
        query = urlencode({"labelSelector": selector})
        obj = self._call("GET", f"{self.base}/overlappingrangeipreservations?{query}")
        items = (obj or {}).get("items") or []
        return [i for i in items if isinstance(i, dict)]

    # ---- transport -------------------------------------------------------------

    def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        missing_ok: bool = False,
        taken: tuple[int, ...] = (),
    ) -> dict[str, Any] | None:
        """One request; None for a 404 when `missing_ok`; Taken for a status in `taken`
        (a failed condition); a CNIError (11 when worth retrying later, else 5) for the rest."""
        try:
            return self.api.request(method, path, body, content_type)
        except APIError as exc:
            if exc.status == 404 and missing_ok:
                return None
            if exc.status in taken:
                raise Taken(path) from exc
            code = ErrorCode.TRY_AGAIN_LATER if retriable(exc) else ErrorCode.IO_FAILURE
            raise CNIError(code, f"whereabouts: {method} {path} failed", str(exc)) from exc
        except OSError as exc:
            raise CNIError(
                ErrorCode.TRY_AGAIN_LATER, "whereabouts: the API server is unreachable", str(exc)
            ) from exc

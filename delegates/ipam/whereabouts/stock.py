"""Addresses a node reserves ahead (the daemon's `ipamReserve`): an ADD takes one without
an API call, and the pool learns who got it right after.

Each pool the node allocates from keeps `size` reservations: allocations written like any
other (with their OverlappingRangeIPReservation in overlapping ranges, labelled
ipam.plexus.io/stock) whose owner is the node itself: id `plexus-reserved-<random>`,
podref `<pools' namespace>/plexus-reserved-<node>`. An ADD takes one and returns its
address at once; a side thread then rewrites the pool entry to the container (a patch that
tests it is still the reservation) and the reservation object to it. A file per rewrite,
written before the ADD returns, lets a restarted daemon finish it; DEL and CHECK of the
container wait for it. The pool is refilled in the background. Being in the pools, a
node's reservations are released with a deleted node's addresses, and a daemon gives back
its own when it starts. A reservation someone else released is dropped, not handed out,
once the pool's copy shows it; whereabouts' reconciler frees them (their podref names no
pod) and a whereabouts binary may hand one out before the watch says so: reserve only once
that reconciler no longer runs.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections import deque
from collections.abc import Collection, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from delegates.ipam.common import IPAddress
from delegates.ipam.whereabouts.batches import Change
from delegates.ipam.whereabouts.config import WhereaboutsConfig
from delegates.ipam.whereabouts.labels import NODE_LABEL, STOCK_LABEL
from delegates.ipam.whereabouts.objects import Allocation, Held, Pool, Taken
from delegates.ipam.whereabouts.pools import PoolStore
from delegates.ipam.whereabouts.ranges import IPRange


class Allocator(Protocol):
    """What the stock needs of delegates.ipam.whereabouts.allocator.Allocator."""

    store: PoolStore
    node: str

    def allocate_one(
        self,
        cfg: WhereaboutsConfig,
        rng: IPRange,
        name: str,
        entry: Allocation,
        labels: Mapping[str, str],
    ) -> Held: ...

    def reservation_name(self, cfg: WhereaboutsConfig, addr: IPAddress) -> str: ...


log = logging.getLogger("plexus.ipam")

PREFIX = "plexus-reserved-"
SIDE_THREADS = 32
"""Rewrites and refills in flight at once: one per concurrent ADD (the daemon serves 32
by default)."""


def owner(namespace: str, node: str) -> str:
    """The podref of a node's reservations."""
    return f"{namespace}/{PREFIX}{node}"


class Stock:
    """The node's reserved addresses, per pool, and the rewrites in flight."""

    def __init__(self, allocator: Allocator, size: int, journal: Path):
        self.allocator = allocator
        self.size = size
        self.journal = journal
        self.side = ThreadPoolExecutor(max_workers=SIDE_THREADS, thread_name_prefix="ipam-stock")
        self.podref = owner(allocator.store.namespace, allocator.node)
        self._free: dict[str, deque[tuple[str, int, str]]] = {}
        self._filling: set[str] = set()
        self._pending: dict[tuple[str, str], Future[None]] = {}
        self._lock = threading.Lock()

    # ---- ADD ---------------------------------------------------------------------------

    def take(
        self, cfg: WhereaboutsConfig, rng: IPRange, pool: Pool | None, entry: Allocation
    ) -> Held | None:
        """A reserved address of `pool` for `entry`, its rewrite started; None when the
        pool has none here (the caller refills it once its own address is written). A
        reservation the pool no longer shows (someone else released it: whereabouts'
        reconciler does) is dropped, not handed out."""
        if pool is None:
            return None
        name = pool.name
        while True:
            with self._lock:
                free = self._free.get(name)
                found = free.popleft() if free else None
            if found is None:
                return None
            key, value, reserved = found
            before = Allocation(reserved, self.podref).body()
            if pool.allocations.get(key) == before:
                break
            log.warning(
                "whereabouts: an address this node reserved ahead was released by someone "
                "else; not handing it out",
                extra={"pool": name, "key": key},
            )
        job = {
            "pool": name,
            "key": key,
            "before": before,
            "after": entry.body(),
            "reservation": self.allocator.reservation_name(cfg, rng.address(value))
            if cfg.overlapping
            else "",
        }
        path = self.journal / uuid.uuid4().hex  # not the pool's name: a NAD chooses that
        self.journal.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.write_text(json.dumps(job))  # a daemon crash keeps it: the page cache does
        done = self.side.submit(self._rewrite, job, path)
        with self._lock:
            self._pending[(entry.id, entry.ifname)] = done
        done.add_done_callback(lambda _: self._settled((entry.id, entry.ifname), done))
        return Held(rng, name, key, value)

    def wait(self, container_id: str, ifname: str) -> None:
        """Until the container's rewrite, if one is in flight, is done."""
        with self._lock:
            pending = self._pending.get((container_id, ifname))
        if pending is not None:
            pending.exception()

    def _settled(self, key: tuple[str, str], done: Future[None]) -> None:
        with self._lock:
            if self._pending.get(key) is done:
                del self._pending[key]

    def _rewrite(self, job: dict[str, Any], path: Path) -> None:
        """The pool entry and its reservation object, from the node's to the container's."""
        store, name, key = self.allocator.store, job["pool"], job["key"]
        for _ in range(10):
            try:  # the patch tests the entry is still the reservation
                store.write(name, Change(key, job["before"], job["after"]))
                break
            except Taken:
                pool = store.refresh(name)
            now = pool.allocations.get(key) if pool is not None else None
            if now == job["after"]:
                break  # a previous daemon's rewrite (the journal's) got there
            if now != job["before"]:
                log.error(
                    "whereabouts: a reserved address was taken from this node before its "
                    "container got it: it may be held twice",
                    extra={"pool": name, "key": key, "now": now, "container": job["after"]},
                )
                break
        if job["reservation"]:
            after = job["after"]
            spec = {"containerid": after["id"], "podref": after["podref"]}
            spec["ifname"] = after.get("ifname", "")
            store.relabel(job["reservation"], spec, {STOCK_LABEL: None})
        path.unlink(missing_ok=True)

    def refill(self, cfg: WhereaboutsConfig, rng: IPRange, name: str) -> None:
        """Top pool `name`'s reservations up to `size`, in the background."""
        with self._lock:
            if name in self._filling or len(self._free.get(name, ())) >= self.size:
                return
            self._filling.add(name)
        self.side.submit(self._fill, cfg, rng, name)

    def _fill(self, cfg: WhereaboutsConfig, rng: IPRange, name: str) -> None:
        try:
            while True:
                with self._lock:
                    if len(self._free.setdefault(name, deque())) >= self.size:
                        return
                reserved = f"{PREFIX}{uuid.uuid4().hex[:16]}"
                entry = Allocation(reserved, self.podref)
                held = self.allocator.allocate_one(cfg, rng, name, entry, {STOCK_LABEL: "true"})
                with self._lock:
                    self._free[name].append((held.key, held.value, reserved))
        except Exception as exc:  # the next ADD tries again
            log.warning("whereabouts: reserving ahead failed", extra={"error": str(exc)})
        finally:
            with self._lock:
                self._filling.discard(name)

    # ---- start, stop, dead nodes ---------------------------------------------------------

    def recover(self) -> None:
        """Finish the rewrites a previous daemon left in the journal."""
        for path in sorted(self.journal.glob("*")) if self.journal.is_dir() else []:
            try:
                self._rewrite(json.loads(path.read_text()), path)
            except (OSError, ValueError) as exc:
                log.warning("whereabouts: journal entry unreadable", extra={"error": str(exc)})

    def close(self) -> None:
        """Stop taking work; rewrites in flight finish (the journal covers a crash)."""
        self.side.shutdown(wait=False)

    def drop(self, node: str) -> int:
        """Release `node`'s reservations (this node's: except those it holds now)."""
        with self._lock:
            mine = {r for free in self._free.values() for _, _, r in free}
        return drop_reserved(self.allocator, [node], mine)


def drop_reserved(allocator: Allocator, nodes: Collection[str], keep: Collection[str] = ()) -> int:
    """Release the reservations `nodes` made ahead in every pool, but those in `keep`; how
    many (deleted nodes', or a restarted daemon's leftovers)."""
    store = allocator.store
    podrefs = {owner(store.namespace, node) for node in nodes}
    dropped = 0
    for pool in store.list_pools():
        for key, raw in list(pool.allocations.items()):
            entry = Allocation.read(raw)
            if entry is None or entry.podref not in podrefs or entry.id in keep:
                continue
            try:
                store.write(pool.name, Change(key, raw, None))
                dropped += 1
            except Taken:
                continue
    for node in nodes:
        for obj in store.reservations(f"{NODE_LABEL}={node},{STOCK_LABEL}=true"):
            if (obj.get("spec") or {}).get("containerid") not in keep:
                store.unreserve(obj)
    return dropped

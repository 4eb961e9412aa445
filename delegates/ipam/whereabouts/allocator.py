"""Allocate and release a container's addresses across a config's ranges.

One address per range, from the range's pool: the lowest free one, as whereabouts picks
it. With overlapping ranges enabled (the default) the address also gets its
OverlappingRangeIPReservation, created once the pool write holds (whereabouts' order: the
pool decides who gets an address, so a whereabouts binary racing for the same address
loses its pool write and never meets a reservation of Plexus's); a reservation that
exists already undoes the pool write and the next address is tried. No lock is taken
outside this process. An allocation is the container's (ID + interface),
not the pod name's: a pod recreated under the same name (a StatefulSet's) gets an
address of its own, and its predecessor's stays until its DEL or GC releases it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Collection, Iterator, Mapping
from ipaddress import ip_interface
from pathlib import Path
from typing import Any

from cni.errors import CNIError, ErrorCode
from cni.result import IPConfig
from delegates.ipam.common import CHECK_FAILED, IPAddress
from delegates.ipam.whereabouts.config import WhereaboutsConfig
from delegates.ipam.whereabouts.labels import CLAIM_LABEL, NODE_LABEL, POOL_ANNOTATION, STOCK_LABEL
from delegates.ipam.whereabouts.objects import Allocation, Held, Pool, Taken
from delegates.ipam.whereabouts.pools import PoolStore
from delegates.ipam.whereabouts.ranges import IPRange, RangeError, pool_name, reservation_name
from delegates.ipam.whereabouts.slices import Slices
from delegates.ipam.whereabouts.stock import Stock

log = logging.getLogger("plexus.ipam")

ATTEMPTS = 100  # as whereabouts' DatastoreRetries
_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")


class Allocator:
    """Allocation over one PoolStore, for the daemon of node `node`."""

    def __init__(self, store: PoolStore, node: str, slices: Slices | None = None) -> None:
        self.store = store
        self.node = node
        self.slices = slices
        self.stock: Stock | None = None

    def reserve_ahead(self, size: int, journal: Path) -> None:
        """Keep `size` addresses reserved per pool for ADDs to take (whereabouts/stock.py),
        after finishing the rewrites a previous daemon left and giving back its leftovers."""
        self.stock = Stock(self, size, journal)
        self.stock.recover()
        self.stock.drop(self.node)

    def close(self) -> None:
        if self.stock is not None:
            self.stock.close()

    # ---- ADD -----------------------------------------------------------------

    def allocate(
        self,
        cfg: WhereaboutsConfig,
        container_id: str,
        ifname: str,
        labels: Mapping[str, str] | None = None,
    ) -> list[IPConfig]:
        """One address per range (the container's own if it holds one already); `labels`
        go on the reservations too."""
        if not cfg.pod_name:
            raise CNIError(ErrorCode.INVALID_ENV, "IPAM client initialization error: no pod name")
        held: list[Held] = []
        try:
            for rng, name in self.ranges_of(cfg):
                entry = Allocation(container_id, cfg.podref, ifname)
                taken = None if labels else self._from_stock(cfg, rng, name, entry)
                held.append(taken or self.allocate_one(cfg, rng, name, entry, labels or {}))
                if self.stock is not None:
                    self.stock.refill(cfg, rng, name)
        except BaseException:
            for done in held:
                try:
                    self._release_one(cfg, done, container_id, ifname)
                except Exception as exc:
                    log.warning("whereabouts: undoing a partial allocation failed: %s", exc)
            raise
        return [ip_config(cfg, h.range, h.value) for h in held]

    def _from_stock(
        self, cfg: WhereaboutsConfig, rng: IPRange, name: str, entry: Allocation
    ) -> Held | None:
        """The container's address already (an ADD again), else one reserved ahead."""
        if self.stock is None:
            return None
        self.stock.wait(entry.id, entry.ifname)
        pool = self.store.get(name, rng.cidr, create=False, shared=not cfg.node_slice_size)
        key = pool.find(entry.id, entry.ifname) if pool is not None else None
        value = rng.from_offset(key) if key is not None else None
        if key is not None and value is not None:
            return Held(rng, name, key, value)
        return self.stock.take(cfg, rng, pool, entry)

    def allocate_one(
        self,
        cfg: WhereaboutsConfig,
        rng: IPRange,
        name: str,
        entry: Allocation,
        labels: Mapping[str, str],
    ) -> Held:
        """`entry`'s address in `rng` (pool `name`): the one it holds, else the lowest free."""
        container_id, ifname = entry.id, entry.ifname
        elsewhere: set[int] = set()  # held in an overlapping range (a reservation says so)
        pool = self._pool(name, rng, not cfg.node_slice_size)
        for _ in range(ATTEMPTS):
            key = pool.find(container_id, ifname)
            value = rng.from_offset(key) if key is not None else None
            if key is not None and value is not None:
                return Held(rng, name, key, value)  # an ADD again: the same address
            used = pool.used(rng)

            def pick(busy: set[int], used: Collection[int] = used) -> int | None:
                return _first_free(rng, used, busy, elsewhere)

            with self.store.picking(name, pick) as value:
                if value is None:
                    raise CNIError(ErrorCode.TRY_AGAIN_LATER, rng.exhausted())
                key = rng.offset(value)
                outcome = self._write(cfg, pool, key, entry, rng.address(value), labels)
            if outcome == "done":
                return Held(rng, name, key, value)
            if outcome == "reserved":
                elsewhere.add(value)
            pool = self.store.refresh(name) or self._pool(name, rng, not cfg.node_slice_size)
        raise CNIError(
            ErrorCode.TRY_AGAIN_LATER,
            f"whereabouts: no address written to IPPool {name} after {ATTEMPTS} attempts",
        )

    def _pool(self, name: str, rng: IPRange, shared: bool) -> Pool:
        pool = self.store.get(name, rng.cidr, shared=shared)
        assert pool is not None  # get() creates it
        return pool

    def _write(
        self,
        cfg: WhereaboutsConfig,
        pool: Pool,
        key: str,
        entry: Allocation,
        addr: IPAddress,
        labels: Mapping[str, str],
    ) -> str:
        """The pool write, then (overlapping) the reservation: "done", "taken" (the pool's
        key was), or "reserved" (the address is held in an overlapping range)."""
        try:
            written = self.store.add(pool, key, entry)
        except Taken:
            return "taken"
        if not cfg.overlapping:
            return "done"
        name = _object_name(reservation_name(addr, cfg.network_name), cfg)
        spec = {"containerid": entry.id, "podref": entry.podref, "ifname": entry.ifname}
        try:
            self.store.reserve(
                name, spec, {NODE_LABEL: self.node, **labels}, {POOL_ANNOTATION: pool.name}
            )
        except Taken:
            if self._ours(name, entry) is not None:
                return "done"  # an earlier attempt's
            self._quietly(lambda: self._unwrite(written, key))
            return "reserved"
        except BaseException:
            self._quietly(lambda: self._unwrite(written, key))
            raise
        return "done"

    def _ours(self, name: str, entry: Allocation) -> dict[str, Any] | None:
        """Reservation `name` if it is this container's (an earlier attempt's)."""
        obj = self.store.reservation(name)
        spec = (obj or {}).get("spec") or {}
        if spec.get("containerid") == entry.id and spec.get("ifname", "") == entry.ifname:
            return obj
        return None

    def _unwrite(self, pool: Pool, key: str) -> None:
        """Take back an allocation this call just wrote."""
        for _ in range(3):
            try:
                self.store.remove(pool, key)
                return
            except Taken:
                fresh = self.store.refresh(pool.name)
                if fresh is None or fresh.allocations.get(key) != pool.allocations.get(key):
                    return
                pool = fresh

    # ---- DEL -----------------------------------------------------------------

    def release(self, cfg: WhereaboutsConfig, container_id: str, ifname: str) -> None:
        """Free what the container+interface holds in each range (nothing held: success)."""
        if self.stock is not None:
            self.stock.wait(container_id, ifname)
        for rng, name in self.ranges_of(cfg):
            held = self.holding(rng, name, container_id, ifname)
            if held is not None:
                self._release_one(cfg, held, container_id, ifname)

    def holding(self, rng: IPRange, name: str, container_id: str, ifname: str) -> Held | None:
        """The container+interface's address in `rng` (pool `name`), read afresh when the
        cache has none."""
        pool = self.store.get(name, rng.cidr, create=False, shared=False)
        key = pool.find(container_id, ifname) if pool is not None else None
        if key is None:
            pool = self.store.refresh(name)
            key = pool.find(container_id, ifname) if pool is not None else None
        value = rng.from_offset(key) if key is not None else None
        if key is None or value is None:
            return None
        return Held(rng, name, key, value)

    def _release_one(
        self, cfg: WhereaboutsConfig, held: Held, container_id: str, ifname: str
    ) -> None:
        entry = self._free(held.pool, container_id, ifname)
        if cfg.overlapping and entry is not None:
            self._unreserve(cfg, held.address, entry)

    def _free(self, name: str, container_id: str, ifname: str) -> Allocation | None:
        """Remove the container+interface's allocation from pool `name` (read afresh when
        the cache does not show it); the entry removed, None if there was none."""
        for _ in range(ATTEMPTS):
            pool = self.store.get(name, "", create=False, shared=False)
            if pool is None or pool.find(container_id, ifname) is None:
                pool = self.store.refresh(name)
            key = pool.find(container_id, ifname) if pool is not None else None
            if pool is None or key is None:
                return None
            entry = pool.entry(key)
            try:
                self.store.remove(pool, key)
                return entry
            except Taken:
                continue
        raise CNIError(
            ErrorCode.TRY_AGAIN_LATER,
            f"whereabouts: IPPool {name} kept changing; container {container_id} not released",
        )

    def _unreserve(self, cfg: WhereaboutsConfig, addr: IPAddress, entry: Allocation) -> None:
        """Delete the address's reservation if it is this allocation's: made by Plexus for
        this container, or by whereabouts (no container ID) for this pod and interface."""
        obj = self.store.reservation(_object_name(reservation_name(addr, cfg.network_name), cfg))
        spec = (obj or {}).get("spec") or {}
        if obj is None or spec.get("ifname", "") != entry.ifname:
            return
        mine = spec.get("containerid") == entry.id
        theirs = not spec.get("containerid") and spec.get("podref") == entry.podref
        if mine or theirs:
            self.store.unreserve(obj)

    # ---- CHECK, GC -----------------------------------------------------------

    def check(
        self, cfg: WhereaboutsConfig, container_id: str, ifname: str, reported: Collection[str]
    ) -> None:
        """Each range's pool holds the container+interface's address (and the previous
        result, when given, reports it); CNIError(100) naming what is missing."""
        if self.stock is not None:
            self.stock.wait(container_id, ifname)
        for rng, name in self.ranges_of(cfg):
            pool = self.store.refresh(name)
            key = pool.find(container_id, ifname) if pool is not None else None
            value = rng.from_offset(key) if key is not None else None
            if value is None:
                raise CNIError(
                    CHECK_FAILED,
                    f"whereabouts: IPPool {name} holds no address for container "
                    f"{container_id} interface {ifname}",
                )
            addr = str(rng.address(value))
            if reported and addr not in reported:
                raise CNIError(
                    CHECK_FAILED,
                    f"whereabouts: IPPool {name} gives {addr} to container {container_id} "
                    f"interface {ifname}, the previous result does not",
                )

    def collect(
        self,
        dead: Callable[[str, str, str], bool],
        selector: str = "",
        pools: Collection[str] | None = None,
    ) -> int:
        """Release the allocations Plexus's reservations matching label `selector`
        (default: those made on this node) point to, in `pools` if given, whose (node,
        container ID, interface) `dead` says is gone; how many were released. Allocations
        without a reservation (overlapping ranges disabled, or made by whereabouts) are
        not found here."""
        released = 0
        for obj in self.store.reservations(selector or f"{NODE_LABEL}={self.node}"):
            meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
            pool = (meta.get("annotations") or {}).get(POOL_ANNOTATION, "")
            node = (meta.get("labels") or {}).get(NODE_LABEL, "")
            cid, ifname = str(spec.get("containerid", "")), str(spec.get("ifname", ""))
            if not cid or not pool or (pools is not None and pool not in pools):
                continue
            if {CLAIM_LABEL, STOCK_LABEL} & set(meta.get("labels") or {}):
                continue  # an IPAMClaim's (released when it is deleted), or reserved ahead
            if not dead(node, cid, ifname):
                continue
            self._free(pool, cid, ifname)
            self.store.unreserve(obj)
            released += 1
            log.info(
                "whereabouts: released a dead container's address",
                extra={"pool": pool, "container": cid, "ifname": ifname, "node": node},
            )
        return released

    @staticmethod
    def reservation_name(cfg: WhereaboutsConfig, addr: IPAddress) -> str:
        """The name of the reservation of `addr` in `cfg`'s network."""
        return reservation_of(cfg, addr)

    def pools_of(self, cfg: WhereaboutsConfig) -> set[str]:
        """The names of the config's pools."""
        return {name for _, name in self.ranges_of(cfg)}

    def ranges_of(self, cfg: WhereaboutsConfig) -> list[tuple[IPRange, str]]:
        """The ranges to allocate from, each with its pool's name: the config's, or with
        node slices this node's slice (whereabouts/slices.py)."""
        if not cfg.node_slice_size:
            return [(r, pool_of(cfg, r)) for r in cfg.ranges]
        if self.slices is None:
            raise CNIError(ErrorCode.INVALID_CONFIG, "node_slice_size needs the node's name")
        mine = self.slices.range_of(cfg)
        name = _object_name(pool_name(mine.cidr, cfg.network_name, self.node), cfg)
        return [(mine, name)]

    # ---- shared ----------------------------------------------------------------

    @staticmethod
    def _quietly(fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception as exc:
            log.warning("whereabouts: undoing a partial allocation failed: %s", exc)


def _first_free(rng: IPRange, *taken: Collection[int]) -> int | None:
    try:
        return rng.first_free(_Union(taken))
    except RangeError as err:
        raise CNIError(ErrorCode.INVALID_CONFIG, str(err)) from None


class _Union:
    """Membership in any of several sets, without building their union."""

    def __init__(self, sets: tuple[Collection[int], ...]) -> None:
        self.sets = sets

    def __contains__(self, value: object) -> bool:
        return any(value in s for s in self.sets)

    def __len__(self) -> int:
        return sum(len(s) for s in self.sets)

    def __iter__(self) -> Iterator[int]:
        for s in self.sets:
            yield from s


def _object_name(name: str, cfg: WhereaboutsConfig) -> str:
    """`name` if the API server accepts it as an object name; else an invalid config."""
    if len(name) > 253 or not _NAME.fullmatch(name):
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            f"whereabouts: {name!r} is not a valid object name",
            f"network_name {cfg.network_name!r} must keep pool and reservation names "
            "lower-case DNS subdomains",
        )
    return name


def ip_config(cfg: WhereaboutsConfig, rng: IPRange, value: int) -> IPConfig:
    """Address `value` of `rng` as an ADD result gives it (the gateway when its family)."""
    gateway = cfg.gateway
    if gateway is not None and gateway.version != rng.network.version:
        gateway = None
    return IPConfig(address=ip_interface(f"{rng.address(value)}/{rng.prefixlen}"), gateway=gateway)


def pool_of(cfg: WhereaboutsConfig, rng: IPRange) -> str:
    """The name of the pool of `rng` (a config error if the API server would refuse it)."""
    return _object_name(pool_name(rng.cidr, cfg.network_name), cfg)


def reservation_of(cfg: WhereaboutsConfig, addr: IPAddress) -> str:
    """The name of the reservation of `addr` (a config error if the API server would
    refuse it)."""
    return _object_name(reservation_name(addr, cfg.network_name), cfg)

"""IPAMClaims (k8s.cni.cncf.io/v1alpha1, NPWG v1.3): addresses that outlive their pods.

A network selection's `ipam-claim-reference` reaches the IPAM as `args.cni` key
`ipam-claim-reference`: the name of an IPAMClaim in the pod's namespace. Its
`status.ips`, once set, are the pod's addresses on every ADD; until then the ADD
allocates and writes them there (with `ownerPod`). The claim gets Plexus's finalizer and
the names of the pools holding its addresses (annotation); DEL leaves claimed addresses
alone, and they are released once the claim is deleted (the daemon's reconcile).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from ipaddress import ip_interface, ip_network
from typing import Any

from cni.errors import CNIError, ErrorCode
from cni.result import IPConfig
from delegates.ipam.common import IPAddress
from delegates.ipam.whereabouts.allocator import (
    ATTEMPTS,
    Allocator,
    ip_config,
    reservation_of,
)
from delegates.ipam.whereabouts.config import WhereaboutsConfig
from delegates.ipam.whereabouts.labels import (
    CLAIM_FINALIZER,
    CLAIM_LABEL,
    CLAIM_POOLS_ANNOTATION,
    IPAMCLAIMS_PATH,
    NODE_LABEL,
    POOL_ANNOTATION,
)
from delegates.ipam.whereabouts.objects import Allocation, Taken
from delegates.ipam.whereabouts.ranges import IPRange
from kube.api import APIError, KubeAPI

Json = dict[str, Any]

CLAIM_KEY = "ipam-claim-reference"
GROUP_VERSION = "k8s.cni.cncf.io/v1alpha1"
MERGE_PATCH = "application/merge-patch+json"


def claim_reference(conf: Mapping[str, Any]) -> str:
    """The claim a plugin config names in `args.cni` ("" for none)."""
    args = conf.get("args")
    cni = args.get("cni") if isinstance(args, Mapping) else None
    value = cni.get(CLAIM_KEY, "") if isinstance(cni, Mapping) else ""
    if not isinstance(value, str):
        raise CNIError(ErrorCode.INVALID_CONFIG, f"args.cni.{CLAIM_KEY} must be a string")
    return value


def path(namespace: str, name: str = "") -> str:
    base = f"/apis/{GROUP_VERSION}/namespaces/{namespace}/ipamclaims"
    return f"{base}/{name}" if name else base


class Claims:
    """IPAMClaims over the daemon's API client."""

    def __init__(self, api: KubeAPI) -> None:
        self.api = api

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        """The claim; code 11 while it does not exist (its controller may make it yet)."""
        try:
            return self.api.request("GET", path(namespace, name))
        except APIError as exc:
            if exc.status == 404:
                raise CNIError(
                    ErrorCode.TRY_AGAIN_LATER, f"IPAMClaim {namespace}/{name} does not exist"
                ) from exc
            raise _failed(f"GET IPAMClaim {namespace}/{name}", exc) from exc
        except OSError as exc:
            raise _failed(f"GET IPAMClaim {namespace}/{name}", exc) from exc

    def record(self, claim: dict[str, Any], ips: list[str], pod: str, pools: list[str]) -> None:
        """Write the claim's addresses: first its finalizer and pools (so a deletion that
        comes next still releases them), then `status.ips` and `ownerPod`."""
        meta = claim["metadata"]
        where = path(meta["namespace"], meta["name"])
        finalizers = list(meta.get("finalizers") or [])
        if CLAIM_FINALIZER not in finalizers:
            finalizers.append(CLAIM_FINALIZER)
        body = {
            "metadata": {
                "resourceVersion": meta["resourceVersion"],
                "finalizers": finalizers,
                "annotations": {CLAIM_POOLS_ANNOTATION: ",".join(pools)},
            }
        }
        status = {"status": {"ips": ips, "ownerPod": {"name": pod}}}
        try:
            self.api.request("PATCH", where, body, MERGE_PATCH)
            self.api.request("PATCH", f"{where}/status", status, MERGE_PATCH)
        except (APIError, OSError) as exc:
            raise _failed(f"writing IPAMClaim {meta['namespace']}/{meta['name']}", exc) from exc

    def deleted(self) -> list[dict[str, Any]]:
        """Claims being deleted that still hold Plexus's finalizer, in every namespace."""
        found = self.api.request("GET", IPAMCLAIMS_PATH)
        return [
            c
            for c in found.get("items", [])
            if c["metadata"].get("deletionTimestamp")
            and CLAIM_FINALIZER in (c["metadata"].get("finalizers") or [])
        ]

    def release(self, claim: dict[str, Any]) -> None:
        """Drop Plexus's finalizer: the claim goes once nothing else holds it."""
        meta = claim["metadata"]
        body = {
            "metadata": {
                "resourceVersion": meta["resourceVersion"],
                "finalizers": [f for f in meta.get("finalizers") or [] if f != CLAIM_FINALIZER],
            }
        }
        self.api.request("PATCH", path(meta["namespace"], meta["name"]), body, MERGE_PATCH)


def _failed(what: str, exc: Exception) -> CNIError:
    return CNIError(ErrorCode.TRY_AGAIN_LATER, f"whereabouts: {what} failed", str(exc))


def adopt(
    allocator: Allocator, cfg: WhereaboutsConfig, container_id: str, ifname: str, claim: Json
) -> list[IPConfig]:
    """The claim's addresses, one per range, now held in their pools by this container."""
    meta = claim["metadata"]
    claimed = []
    for text in (claim.get("status") or {}).get("ips") or []:
        with contextlib.suppress(ValueError):
            claimed.append(ip_interface(str(text)).ip)
    entry = Allocation(container_id, cfg.podref, ifname)
    out = []
    for rng, name in allocator.ranges_of(cfg):
        addr = next(
            (a for a in claimed if a.version == rng.network.version and a in rng.network), None
        )
        if addr is None:
            raise CNIError(
                ErrorCode.INVALID_CONFIG,
                f"IPAMClaim {meta['namespace']}/{meta['name']} has no address in range {rng.cidr}",
            )
        _hold(allocator, cfg, rng, name, addr, entry, meta["uid"])
        out.append(ip_config(cfg, rng, int(addr)))
    return out


def _hold(
    allocator: Allocator,
    cfg: WhereaboutsConfig,
    rng: IPRange,
    name: str,
    addr: IPAddress,
    entry: Allocation,
    uid: str,
) -> None:
    """Make the pool give `addr` to `entry`: the claim's reservation proves the address is
    the claim's (without overlapping ranges, an entry of the pod's namespace does)."""
    store, key = allocator.store, rng.offset(int(addr))
    if cfg.overlapping:
        reserved = reservation_of(cfg, addr)
        labels = {NODE_LABEL: allocator.node, CLAIM_LABEL: uid}
        spec = {"containerid": entry.id, "podref": entry.podref, "ifname": entry.ifname}
        try:
            store.reserve(reserved, spec, labels, {POOL_ANNOTATION: name})
        except Taken:
            obj = store.reservation(reserved) or {}
            if ((obj.get("metadata") or {}).get("labels") or {}).get(CLAIM_LABEL) != uid:
                raise _held_elsewhere(addr, (obj.get("spec") or {}).get("podref", "?")) from None
    for _ in range(ATTEMPTS):
        pool = store.get(name, rng.cidr, shared=not cfg.node_slice_size)
        assert pool is not None  # get() creates it
        current = pool.entry(key)
        if current == entry:
            return
        theirs = current is not None and current.podref.split("/", 1)[0] != cfg.pod_namespace
        if theirs and not cfg.overlapping:
            raise _held_elsewhere(addr, current.podref if current else "?")
        try:
            store.put(pool, key, entry)
            return
        except Taken:
            store.refresh(name)
    raise CNIError(ErrorCode.TRY_AGAIN_LATER, f"whereabouts: IPPool {name} kept changing")


def _held_elsewhere(addr: IPAddress, podref: str) -> CNIError:
    return CNIError(
        ErrorCode.TRY_AGAIN_LATER,
        f"whereabouts: the claimed address {addr} is held by {podref}",
        "an IPAMClaim's address was released while the claim exists; delete the claim "
        "to have a new one allocated",
    )


def release_claim(allocator: Allocator, claim: Json) -> None:
    """Free a deleted claim's addresses in the pools it names, and their reservations."""
    meta, store = claim["metadata"], allocator.store
    addresses = []
    for text in (claim.get("status") or {}).get("ips") or []:
        with contextlib.suppress(ValueError):
            addresses.append(ip_interface(str(text)).ip)
    names = (meta.get("annotations") or {}).get(CLAIM_POOLS_ANNOTATION, "")
    for name in filter(None, names.split(",")):
        for _ in range(ATTEMPTS):
            pool = store.refresh(name)
            try:
                rng = IPRange(ip_network(pool.range)) if pool is not None else None
            except ValueError:
                rng = None
            if pool is None or rng is None:
                break
            keys = [
                rng.offset(int(a))
                for a in addresses
                if a.version == rng.network.version and a in rng.network
            ]
            held = [k for k in keys if k in pool.allocations]
            if not held:
                break
            with contextlib.suppress(Taken):
                store.remove(pool, held[0])
    for obj in store.reservations(f"{CLAIM_LABEL}={meta['uid']}"):
        store.unreserve(obj)

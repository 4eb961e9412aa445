"""Node slices (whereabouts' `node_slice_size`): a network's range cut into slices, one
per node, each node allocating from a pool of its own.

The network's NodeSlicePool (named `network_name`, else the network's name) lists the
slices in `status.allocations` (`{nodeName, sliceRange}`, nodeName "" while free), as
whereabouts' node-slice-controller writes it. A daemon reads its node's slice there; a
network whose NodeSlicePool does not exist yet gets one (every slice free), and a node
without a slice takes a free one with a patch that tests it is still free. Both do what
the controller does when it runs (it assigns a slice only to a node that has none, and
never moves one), so the two can run side by side. The node's
pool is `<network_name>-<node>-<slice>`; only this node writes it, so an ADD's write is one
small object however large the network. The Lease holder gives a deleted node's slices
back (`free`).
"""

from __future__ import annotations

import threading
import zlib
from ipaddress import ip_network
from typing import Any

from cni.errors import CNIError, ErrorCode
from delegates.ipam.whereabouts.config import WhereaboutsConfig
from delegates.ipam.whereabouts.objects import GROUP_VERSION
from delegates.ipam.whereabouts.ranges import IPRange, Network
from kube.api import APIError, KubeAPI

MAX_SLICES = 4096
"""A NodeSlicePool lists every slice: more would make it too large an object to rewrite
whenever a node joins."""
ATTEMPTS = 20
JSON_PATCH = "application/json-patch+json"


def slices_of(cidr: str, size: str) -> list[str]:
    """`cidr` cut into slices of prefix `size` ("/25" or "25"), in order."""
    network = ip_network(cidr, strict=False)
    text = size.removeprefix("/")
    if not text.isdigit() or not network.prefixlen <= int(text) <= network.max_prefixlen:
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            f"node_slice_size {size!r} does not cut range {cidr}",
            "give a prefix length at least the range's, e.g. /24",
        )
    count = 2 ** (int(text) - network.prefixlen)
    if count > MAX_SLICES:
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            f"node_slice_size {size!r} cuts range {cidr} into {count} slices",
            f"at most {MAX_SLICES}: use a larger slice",
        )
    return [str(s) for s in network.subnets(new_prefix=int(text))]


class Slices:
    """This node's slice of each node-slice network, over the daemon's API client."""

    def __init__(self, api: KubeAPI, namespace: str, node: str) -> None:
        self.api = api
        self.base = f"/apis/{GROUP_VERSION}/namespaces/{namespace}/nodeslicepools"
        self.node = node
        self._mine: dict[str, str] = {}
        self._lock = threading.Lock()

    def range_of(self, cfg: WhereaboutsConfig) -> IPRange:
        """The range this node allocates from: its slice's usable addresses, given with the
        whole range's prefix length (the config's range_start, range_end and exclude do not
        apply: as in whereabouts)."""
        if not cfg.ranges:
            raise CNIError(ErrorCode.INVALID_CONFIG, "node_slice_size needs a range")
        name = cfg.network_name or cfg.name
        with self._lock:
            mine = self._mine.get(name)
        if mine is None:
            mine = self._take(name, cfg.ranges[0].cidr, cfg.node_slice_size)
            with self._lock:
                self._mine[name] = mine
        return IPRange(_network(mine), subnet_prefix=cfg.ranges[0].network.prefixlen)

    def _take(self, name: str, cidr: str, size: str) -> str:
        """This node's slice in NodeSlicePool `name`: the one it holds, else a free one,
        written (the pool made first if need be). The search for a free slice starts at a
        place of the node's own, so nodes joining at once seldom pick the same one; the
        write tests that slice is still free, so two never both take it."""
        for _ in range(ATTEMPTS):
            obj = self._get(name) or self._create(name, cidr, size)
            if obj is None:
                continue  # made by someone else meanwhile
            allocations = (obj.get("status") or {}).get("allocations") or []
            held = [a for a in allocations if a.get("nodeName") == self.node]
            if held:
                return str(held[0]["sliceRange"])
            start = zlib.crc32(self.node.encode()) % max(1, len(allocations))
            order = [*range(start, len(allocations)), *range(start)]
            free = next((i for i in order if not allocations[i].get("nodeName")), None)
            if free is None:
                raise CNIError(
                    ErrorCode.TRY_AGAIN_LATER,
                    f"NodeSlicePool {name} has no free slice for node {self.node}",
                    "every slice is taken: a larger range or smaller slices make room",
                )
            if self._claim(name, free, allocations[free]):
                return str(allocations[free]["sliceRange"])
        raise CNIError(ErrorCode.TRY_AGAIN_LATER, f"NodeSlicePool {name} kept changing")

    def _claim(self, name: str, index: int, slot: dict[str, Any]) -> bool:
        """Write this node into slice `index` if it still is `slot` and free."""
        path = f"/status/allocations/{index}"
        ops = [
            {"op": "test", "path": f"{path}/sliceRange", "value": slot["sliceRange"]},
            {"op": "test", "path": f"{path}/nodeName", "value": slot.get("nodeName", "")},
            {"op": "replace", "path": f"{path}/nodeName", "value": self.node},
        ]
        try:
            self._call("PATCH", f"{self.base}/{name}", ops, JSON_PATCH)
        except APIError as exc:
            if exc.status in (409, 422):
                return False
            raise _failed(f"updating NodeSlicePool {name}", exc) from exc
        return True

    def free(self, node: str) -> int:
        """Give the slices of (deleted) `node` back in every NodeSlicePool; how many."""
        freed = 0
        for obj in self._call("GET", self.base).get("items", []):
            for _ in range(ATTEMPTS):
                allocations = (obj.get("status") or {}).get("allocations") or []
                mine = [a for a in allocations if a.get("nodeName") == node]
                if not mine:
                    break
                for a in mine:
                    a["nodeName"] = ""
                if self._put(obj["metadata"]["name"], obj):
                    freed += len(mine)
                    break
                obj = self._get(obj["metadata"]["name"]) or {}
        return freed

    def _get(self, name: str) -> dict[str, Any] | None:
        try:
            return self._call("GET", f"{self.base}/{name}")
        except APIError as exc:
            if exc.status == 404:
                return None
            raise _failed(f"GET NodeSlicePool {name}", exc) from exc

    def _create(self, name: str, cidr: str, size: str) -> dict[str, Any] | None:
        body = {
            "apiVersion": GROUP_VERSION,
            "kind": "NodeSlicePool",
            "metadata": {"name": name},
            "spec": {"range": cidr, "sliceSize": size},
            "status": {
                "allocations": [{"nodeName": "", "sliceRange": s} for s in slices_of(cidr, size)]
            },
        }
        try:
            return self._call("POST", self.base, body)
        except APIError as exc:
            if exc.status == 409:
                return None
            raise _failed(f"creating NodeSlicePool {name}", exc) from exc

    def _put(self, name: str, obj: dict[str, Any]) -> bool:
        """Write `obj` back if nobody changed it since it was read (False if someone did)."""
        try:
            self._call("PUT", f"{self.base}/{name}", obj)
        except APIError as exc:
            if exc.status == 409:
                return False
            raise _failed(f"updating NodeSlicePool {name}", exc) from exc
        return True

    def _call(
        self, method: str, path: str, body: Any = None, content: str = "application/json"
    ) -> dict[str, Any]:
        try:
            return self.api.request(method, path, body, content)
        except OSError as exc:
            raise CNIError(
                ErrorCode.TRY_AGAIN_LATER, "whereabouts: the API server is unreachable", str(exc)
            ) from exc


def _network(cidr: str) -> Network:
    return ip_network(cidr, strict=False)


def _failed(what: str, exc: APIError) -> CNIError:
    return CNIError(ErrorCode.TRY_AGAIN_LATER, f"whereabouts: {what} failed", str(exc))

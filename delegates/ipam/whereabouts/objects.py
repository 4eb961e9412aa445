"""The objects of whereabouts' store as Plexus reads them: IPPools and their allocations."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from delegates.ipam.common import IPAddress
from delegates.ipam.whereabouts.ranges import IPRange

GROUP_VERSION = "whereabouts.cni.cncf.io/v1alpha1"


class Taken(Exception):
    """A conditional write found the pool or reservation changed: retry with fresh state."""


@dataclass(frozen=True)
class Allocation:
    """One `spec.allocations` entry."""

    id: str
    podref: str
    ifname: str = ""

    def body(self) -> dict[str, str]:
        """The entry as whereabouts writes it (`ifname` omitted when empty)."""
        out = {"id": self.id, "podref": self.podref}
        if self.ifname:
            out["ifname"] = self.ifname
        return out

    @classmethod
    def read(cls, raw: Any) -> Allocation | None:
        if not isinstance(raw, dict):
            return None
        return cls(str(raw.get("id", "")), str(raw.get("podref", "")), str(raw.get("ifname", "")))


@dataclass(eq=False)
class Pool:
    """An IPPool as read, with lookups computed once per version."""

    namespace: str
    name: str
    range: str
    resource_version: str
    allocations: dict[str, Any]
    _by_owner: dict[tuple[str, str], str] | None = field(default=None, repr=False)
    _used: dict[str, frozenset[int]] = field(default_factory=dict, repr=False)

    @classmethod
    def read(cls, obj: dict[str, Any]) -> Pool:
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        allocations = spec.get("allocations")
        return cls(
            namespace=str(meta.get("namespace", "")),
            name=str(meta.get("name", "")),
            range=str(spec.get("range", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            allocations=allocations if isinstance(allocations, dict) else {},
        )

    def find(self, container_id: str, ifname: str) -> str | None:
        """The key of the container+interface's allocation, if it holds one."""
        if self._by_owner is None:
            owners: dict[tuple[str, str], str] = {}
            for key, raw in self.allocations.items():
                entry = Allocation.read(raw)
                if entry is not None:
                    owners.setdefault((entry.id, entry.ifname), key)
            self._by_owner = owners
        return self._by_owner.get((container_id, ifname))

    def used(self, rng: IPRange) -> frozenset[int]:
        """The addresses of `rng` this pool holds (keys whereabouts cannot read skipped)."""
        used = self._used.get(rng.cidr)
        if used is None:
            values = (rng.from_offset(key) for key in self.allocations)
            used = self._used[rng.cidr] = frozenset(v for v in values if v is not None)
        return used

    def entry(self, key: str) -> Allocation | None:
        return Allocation.read(self.allocations.get(key))

    def newer_than(self, other: Pool) -> bool:
        return _version(self.resource_version) > _version(other.resource_version)


def _version(rv: str) -> int:
    return int(rv) if rv.isdigit() else -1


@dataclass(frozen=True)
class Held:
    """An address a container holds: its range, pool and pool key."""

    range: IPRange
    pool: str
    key: str
    value: int

    @property
    def address(self) -> IPAddress:
        return self.range.address(self.value)

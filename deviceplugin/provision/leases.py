"""At most N holders at once, coordinated through Leases on the API server (no controller).

A pool that lets N nodes disrupt at once has N slots, Leases named `<prefix>-0` ..
`<prefix>-(N-1)`. A node takes a free slot by creating its Lease, or by updating one that is
empty or has expired, with the resourceVersion it read: of two nodes racing for a slot, the
API server lets one win (409 for the other). The holder renews its Lease while it works and
empties it when done; a node that dies loses its slot when the Lease expires. The agent
that renders NADs is chosen the same way, with one slot.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any

from kube.api import APIError, KubeAPI

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"

log = logging.getLogger("plexus.provision")

Json = dict[str, Any]


def _now() -> datetime:
    return datetime.now(UTC)


def _micro(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (AttributeError, ValueError):
        return None


class LeaseSlots:
    """The slots `<prefix>-<i>` in `namespace`, taken as `holder`."""

    def __init__(
        self, api: KubeAPI, namespace: str, prefix: str, holder: str, duration: int = 60
    ) -> None:
        self.api = api
        self.path = LEASES.format(ns=namespace)
        self.prefix = prefix
        self.holder = holder
        self.duration = duration
        self.held: str = ""  # the Lease we hold, "" if none

    def _free(self, lease: Json) -> bool:
        spec = lease.get("spec") or {}
        if not spec.get("holderIdentity") or spec.get("holderIdentity") == self.holder:
            return True
        renewed = _parse(spec.get("renewTime") or spec.get("acquireTime") or "")
        seconds = int(spec.get("leaseDurationSeconds") or self.duration)
        return renewed is None or renewed + timedelta(seconds=seconds) < _now()

    def _spec(self, lease: Json | None) -> Json:
        now = _micro(_now())
        spec = dict((lease or {}).get("spec") or {})
        if spec.get("holderIdentity") != self.holder:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (lease is not None)
        spec.update(holderIdentity=self.holder, leaseDurationSeconds=self.duration, renewTime=now)
        return spec

    def acquire(self, slots: int) -> bool:
        """Hold (or renew) one of `slots` slots; False when all are held by others."""
        if self.held and int(self.held.rsplit("-", 1)[1]) >= slots:
            self.release()  # the pool shrank under us
        names = [f"{self.prefix}-{i}" for i in range(slots)]
        if self.held:
            names.remove(self.held)
            names.insert(0, self.held)
        for name in names:
            if self._take(name):
                self.held = name
                return True
        self.held = ""
        return False

    def _take(self, name: str) -> bool:
        try:
            lease: Json | None = self.api.request("GET", f"{self.path}/{name}")
        except APIError as exc:
            if exc.status != 404:
                raise
            lease = None
        try:
            if lease is None:
                body = {"metadata": {"name": name}, "spec": self._spec(None)}
                self.api.request("POST", self.path, body)
                return True
            if not self._free(lease):
                return False
            meta = lease["metadata"]
            body = {
                "metadata": {"name": name, "resourceVersion": meta["resourceVersion"]},
                "spec": self._spec(lease),
            }
            self.api.request("PUT", f"{self.path}/{name}", body)
            return True
        except APIError as exc:
            if exc.status == 409:  # another node won this slot first
                return False
            raise

    def release(self) -> None:
        """Empty the Lease we hold (kept, so its transitions count on)."""
        name, self.held = self.held, ""
        if not name:
            return
        try:
            lease = self.api.request("GET", f"{self.path}/{name}")
            if (lease.get("spec") or {}).get("holderIdentity") != self.holder:
                return
            spec = dict(lease["spec"])
            spec.pop("holderIdentity", None)
            body = {"metadata": lease["metadata"], "spec": spec}
            self.api.request("PUT", f"{self.path}/{name}", body)
        except APIError as exc:
            if exc.status not in (404, 409):
                raise
            log.info("lease %s already gone or taken: %s", name, exc)

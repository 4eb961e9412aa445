"""A coordination.k8s.io/v1 Lease held by one of many identical workers for one job.

`try_hold()` is called by every worker on its own schedule: it creates the Lease, renews
it when held, or takes it over once its holder has not renewed for the lease duration.
Each write is conditional on the resourceVersion read, so two workers never both win.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from kube.api import APIError, KubeAPI


class Lease:
    """Lease `name` in `namespace`, held as `identity` for `duration` seconds at a time."""

    def __init__(
        self, api: KubeAPI, namespace: str, name: str, identity: str, duration: float
    ) -> None:
        self.api = api
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
        self.name = name
        self.identity = identity
        self.duration = max(1, round(duration))

    def try_hold(self) -> bool:
        """True if this worker holds the Lease now (acquired, renewed or taken over);
        False if another holds it or the API server could not be asked."""
        now = datetime.now(UTC)
        try:
            current = self.api.request("GET", f"{self.path}/{self.name}")
        except APIError as exc:
            if exc.status != 404:
                return False
            return self._write("POST", self.path, self._body(now, None, now))
        except OSError:
            return False
        spec = current.get("spec") or {}
        holder = spec.get("holderIdentity", "")
        if holder != self.identity and not _expired(spec, now):
            return False
        acquired = spec.get("acquireTime") if holder == self.identity else None
        body = self._body(now, current["metadata"]["resourceVersion"], acquired or now)
        return self._write("PUT", f"{self.path}/{self.name}", body)

    def _body(self, now: datetime, version: str | None, acquired: Any) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name}
        if version is not None:
            metadata["resourceVersion"] = version
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.duration,
                "acquireTime": acquired if isinstance(acquired, str) else _micro(acquired),
                "renewTime": _micro(now),
            },
        }

    def _write(self, method: str, path: str, body: dict[str, Any]) -> bool:
        try:
            self.api.request(method, path, body)
        except (APIError, OSError):  # 409: another worker won this round
            return False
        return True


def _micro(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _expired(spec: dict[str, Any], now: datetime) -> bool:
    renewed = spec.get("renewTime") or spec.get("acquireTime")
    if not renewed:
        return True
    try:
        when = datetime.fromisoformat(str(renewed).replace("Z", "+00:00"))
    except ValueError:
        return True
    return when + timedelta(seconds=int(spec.get("leaseDurationSeconds") or 0)) < now

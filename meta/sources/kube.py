"""The Kubernetes cluster source: informer caches for NADs and this node's pods.

In the daemon, list+watch keeps both caches warm, so an ADD makes no GET. The
network-status is one merge PATCH on `pods/status` made during the ADD, bounded by
`write_timeout`; past that it continues in the background writer (writes.py), where
events always go. Without informers (thin mode) look-ups are GETs and writes are
one bounded attempt each.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.parse
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar

from cni.errors import CNIError, ErrorCode
from meta.config import DEFAULT_WRITE_BACKLOG, DEFAULT_WRITE_TIMEOUT
from meta.sources.base import NetworkAttachmentDefinition, Pod
from meta.sources.kubeapi import APIError, KubeAPI
from meta.sources.writes import BackgroundWriter, Write, retriable
from meta.status import NETWORK_STATUS_ANNOTATION

log = logging.getLogger("plexus.kube")

NAD_PATH = "/apis/k8s.cni.cncf.io/v1/network-attachment-definitions"
POD_PATH = "/api/v1/pods"
WATCH_SECONDS = 300
POD_WAIT_SECONDS = 3.0
STOP_GRACE_SECONDS = 3.0  # for queued writes when the daemon stops


def _pod(obj: dict[str, Any]) -> Pod:
    meta = obj.get("metadata", {})
    return Pod(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        annotations=meta.get("annotations") or {},
        node_name=(obj.get("spec") or {}).get("nodeName", ""),
    )


def _uid_mismatch(exc: APIError) -> bool:
    """The UID precondition failed: the pod was deleted and made again under its name."""
    return exc.status == 422 and "metadata.uid" in str(exc)


def _nad(obj: dict[str, Any]) -> NetworkAttachmentDefinition:
    meta = obj.get("metadata", {})
    return NetworkAttachmentDefinition(
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        config=(obj.get("spec") or {}).get("config", "") or "",
        annotations=meta.get("annotations") or {},
    )


class _Named(Protocol):
    namespace: str
    name: str


T = TypeVar("T", bound=_Named)


class Informer(Generic[T]):
    """List then watch one collection, keeping converted objects by (namespace, name).

    Each listener is called (on the informer's thread, so it must be quick) with the old
    and new object whenever one is added or changes, re-lists included.
    """

    def __init__(
        self,
        api: KubeAPI,
        path: str,
        query: dict[str, str],
        convert: Callable[[dict[str, Any]], T],
    ) -> None:
        self.api = api
        self.path = path
        self.query = query
        self.convert = convert
        self.items: dict[tuple[str, str], T] = {}
        self.listeners: list[Callable[[T | None, T], None]] = []
        self.synced = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"informer:{path}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def get(self, namespace: str, name: str) -> T | None:
        return self.items.get((namespace, name))

    def size(self) -> int:
        return len(self.items)

    def _url(self, **extra: str) -> str:
        return f"{self.path}?{urllib.parse.urlencode({**self.query, **extra})}"

    def _run(self) -> None:
        backoff = 0.5
        while not self._stop.is_set():
            try:
                version = self._list()
                backoff = 0.5
                self._watch(version)
            except Exception as exc:  # an informer must outlive any failure; it re-lists
                log.warning("informer restarting", extra={"path": self.path, "error": str(exc)})
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _list(self) -> str:
        body = self.api.request("GET", self._url())
        fresh = {}
        for obj in body.get("items", []):
            item = self.convert(obj)
            fresh[(item.namespace, item.name)] = item
        old, self.items = self.items, fresh
        for key, item in fresh.items():
            if old.get(key) != item:
                self._notify(old.get(key), item)
        self.synced.set()
        return str(body.get("metadata", {}).get("resourceVersion", ""))

    def _watch(self, version: str) -> None:
        url = self._url(
            watch="1",
            resourceVersion=version,
            allowWatchBookmarks="true",
            timeoutSeconds=str(WATCH_SECONDS),
        )
        for event in self.api.watch(url, WATCH_SECONDS):
            kind, obj = event.get("type"), event.get("object") or {}
            if kind == "ERROR":
                raise APIError(int(obj.get("code", 500)), str(obj.get("message", "")))
            if kind == "BOOKMARK" or self._stop.is_set():
                continue
            item = self.convert(obj)
            key = (item.namespace, item.name)
            if kind == "DELETED":
                self.items.pop(key, None)
            else:
                old = self.items.get(key)
                self.items[key] = item
                self._notify(old, item)

    def _notify(self, old: T | None, new: T) -> None:
        for listener in self.listeners:
            try:
                listener(old, new)
            except Exception:  # a listener's bug must not stop the informer
                log.exception("informer listener failed", extra={"path": self.path})


class KubeSource:
    """ClusterSource backed by the API server."""

    def __init__(
        self,
        api: KubeAPI,
        node_name: str = "",
        informers: bool = False,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
        backlog: int = DEFAULT_WRITE_BACKLOG,
    ) -> None:
        self.api = api
        self.node_name = node_name
        self.nads: Informer[NetworkAttachmentDefinition] | None = None
        self.pods: Informer[Pod] | None = None
        self.write_timeout = write_timeout
        self.writer: BackgroundWriter | None = None
        if informers:
            query = {"fieldSelector": f"spec.nodeName={node_name}"} if node_name else {}
            self.pods = Informer(api, POD_PATH, query, _pod)
            self.nads = Informer(api, NAD_PATH, {}, _nad)
            self.writer = BackgroundWriter(backlog, api.timeout)

    def start(self) -> None:
        for informer in (self.pods, self.nads):
            if informer is not None:
                informer.start()
        if self.writer is not None:
            self.writer.start()

    def stop(self) -> None:
        for informer in (self.pods, self.nads):
            if informer is not None:
                informer.stop()
        if self.writer is not None:
            self.writer.close(STOP_GRACE_SECONDS)

    def synced(self) -> bool:
        return all(i is None or i.synced.is_set() for i in (self.pods, self.nads))

    # ---- reads ---------------------------------------------------------------

    def get_pod(self, namespace: str, name: str, wait: bool = True) -> Pod | None:
        if self.pods is not None:
            if not wait and self.pods.synced.is_set():
                return self.pods.get(namespace, name)  # the synced cache is the answer
            deadline = time.monotonic() + POD_WAIT_SECONDS
            while time.monotonic() < deadline:
                pod = self.pods.get(namespace, name)
                if pod is not None:
                    return pod
                time.sleep(0.05)
            log.info(
                "pod not in the cache after a wait; asking the API server",
                extra={"pod": f"{namespace}/{name}"},
            )
        return self._get(f"/api/v1/namespaces/{namespace}/pods/{name}", _pod)

    def get_nad(self, namespace: str, name: str) -> NetworkAttachmentDefinition | None:
        if self.nads is not None and self.nads.synced.is_set():
            return self.nads.get(namespace, name)
        return self._get(
            f"/apis/k8s.cni.cncf.io/v1/namespaces/{namespace}/network-attachment-definitions/{name}",
            _nad,
        )

    def _get(self, path: str, convert: Callable[[dict[str, Any]], T]) -> T | None:
        try:
            return convert(self.api.request("GET", path))
        except APIError as exc:
            if exc.status == 404:
                return None
            raise CNIError(ErrorCode.TRY_AGAIN_LATER, f"GET {path} failed", str(exc)) from exc
        except OSError as exc:
            raise CNIError(
                ErrorCode.TRY_AGAIN_LATER, "the API server is unreachable", str(exc)
            ) from exc

    # ---- writes --------------------------------------------------------------

    def set_network_status(self, pod: Pod, value: str) -> None:
        path = f"/api/v1/namespaces/{pod.namespace}/pods/{pod.name}/status"
        metadata: dict[str, Any] = {"annotations": {NETWORK_STATUS_ANNOTATION: value}}
        if pod.uid:
            metadata["uid"] = pod.uid  # a precondition: never the status of a newer namesake
        body = {"metadata": metadata}

        def send(timeout: float) -> None:
            self.api.request(
                "PATCH", path, body, content_type="application/merge-patch+json", timeout=timeout
            )

        what = f"network-status of {pod.namespace}/{pod.name}"
        key = (pod.namespace, pod.name)
        try:
            send(self.write_timeout)
        except (APIError, OSError) as exc:
            if isinstance(exc, APIError) and (exc.status == 404 or _uid_mismatch(exc)):
                log.warning(
                    "pod gone or replaced; network-status not written", extra={"what": what}
                )
                return
            if not retriable(exc):
                raise CNIError(ErrorCode.IO_FAILURE, f"writing {what} failed", str(exc)) from exc
            if self.writer is None:
                raise CNIError(
                    ErrorCode.TRY_AGAIN_LATER, f"writing {what} failed", str(exc)
                ) from exc
            self.writer.put_status(key, Write("status", what, send))
            log.warning(
                "network-status not written within the bound; queued",
                extra={"what": what, "bound_s": self.write_timeout, "error": str(exc)},
            )
            return
        if self.writer is not None:
            self.writer.discard_status(key)  # an older value still queued must not land later

    def record_event(self, pod: Pod, type_: str, reason: str, message: str) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "metadata": {"generateName": f"{pod.name}.", "namespace": pod.namespace},
            "involvedObject": {
                "kind": "Pod",
                "apiVersion": "v1",
                "namespace": pod.namespace,
                "name": pod.name,
                "uid": pod.uid,
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": "plexus", "host": self.node_name},
            "reportingComponent": "plexus",
            "reportingInstance": self.node_name or "plexus",
        }

        def send(timeout: float) -> None:
            self.api.request(
                "POST", f"/api/v1/namespaces/{pod.namespace}/events", event, timeout=timeout
            )

        what = f"event {reason} on {pod.namespace}/{pod.name}"
        if self.writer is not None:
            self.writer.put_event(Write("event", what, send))
            return
        try:  # thin mode: no thread outlives the call, so one bounded try
            send(self.write_timeout)
        except (APIError, OSError) as exc:
            log.warning("event not recorded", extra={"what": what, "error": str(exc)})

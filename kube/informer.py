"""An informer: list then watch one API collection into a cache of converted objects."""

from __future__ import annotations

import logging
import threading
import urllib.parse
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from kube.api import APIError, KubeAPI, Stop

log = logging.getLogger("plexus.kube")

WATCH_SECONDS = 300


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
        self._stop = Stop()
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
                if self._stop.is_set():
                    return
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
        for event in self.api.watch(url, WATCH_SECONDS, self._stop):
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

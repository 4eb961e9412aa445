"""Hot-plug in the daemon: when a running pod's networks annotation changes, its
containers' secondary networks are attached and detached to match (Engine.sync).

Changes come from the pod informer (Kubernetes) or from `StorePoller` (the embedded
store, read every second); either calls `pod_changed` on its own thread, and the work
happens on one worker thread, one pod at a time, in the order the changes arrived.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from cni import callscope
from cni.errors import CNIError
from meta.config import MetaConfig
from meta.plugin import MetaPlugin
from meta.records import RecordStore
from meta.selection import NETWORKS_ANNOTATION
from meta.sources.base import Pod

if TYPE_CHECKING:  # the store (and yaml) only loads when a config names one
    from meta.sources.store import EmbeddedStore

log = logging.getLogger("plexus.hotplug")


class HotplugWorker:
    """Queues pods whose networks annotation changed and syncs their containers."""

    def __init__(self, plugin: MetaPlugin, conf: MetaConfig) -> None:
        self.plugin = plugin
        self.conf = conf
        self._queue: queue.Queue[tuple[str, str] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="hotplug", daemon=True)

    def pod_changed(self, old: Pod | None, new: Pod) -> None:
        """Informer listener: a pod already known whose annotation changed is queued."""
        if old is not None and old.annotations.get(NETWORKS_ANNOTATION) != new.annotations.get(
            NETWORKS_ANNOTATION
        ):
            self._queue.put((new.namespace, new.name))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Finish the queued work, then end the worker."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (key := self._queue.get()) is not None:
            try:
                self.sync(*key)
            except Exception:  # one pod's failure must not end hot-plug for the node
                log.exception("hot-plug failed", extra={"pod": f"{key[0]}/{key[1]}"})

    def sync(self, namespace: str, name: str) -> None:
        """Sync every container of the pod on this node."""
        for record in RecordStore(self.conf.cni_dir).all():
            if (record.pod_namespace or "default", record.pod_name) == (namespace, name):
                with callscope.call_scope():  # its plugin execs get delegateTimeoutSeconds
                    self.plugin.engine_for(self.conf, record.path).sync(record.container_id)


class StorePoller:
    """Reads the embedded store's pods every `interval` seconds and reports changes."""

    def __init__(
        self,
        store: EmbeddedStore,
        listener: Callable[[Pod | None, Pod], None],
        interval: float = 1.0,
    ) -> None:
        self.store = store
        self.listener = listener
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="store-poller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _snapshot(self) -> dict[tuple[str, str], Pod]:
        try:
            return {(p.namespace, p.name): p for p in self.store.pods()}
        except CNIError as exc:  # the directory is unreadable just now: try again later
            log.warning("cannot read the embedded store", extra={"error": str(exc)})
            return {}

    def _run(self) -> None:
        known = self._snapshot()
        while not self._stop.wait(self.interval):
            now = self._snapshot()
            for key, pod in now.items():
                if known.get(key) != pod:
                    self.listener(known.get(key), pod)
            known = now or known

"""The node's side of the engine: its files, its locks and the pod namespaces' routes.

Everything the engine keeps or changes on this node outside the delegates goes through
here: attachment records, the locks, the readiness indicator, device-info files and
the default routes that `default-route` moves inside a pod's namespace.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from cni import fileio
from cni.errors import CNIError, ErrorCode
from cni.logs import StepLogger
from delegates.ipam.store import open_store
from delegates.netns import netns_exists
from meta import deviceinfo, routes
from meta.config import MetaConfig
from meta.delegate import Delegate
from meta.locks import ContainerLocks, file_lock, remove_lock_file
from meta.ranges import RangeLedger, range_leases, ranges_in_use, unowned_leases
from meta.records import AttachmentRecord, RecordStore

READINESS_WAIT_SECONDS = 10.0


class Node:
    """One meta config's state on this node."""

    def __init__(self, conf: MetaConfig, locks: ContainerLocks | None = None) -> None:
        self.conf = conf
        self.records = RecordStore(conf.cni_dir)
        self.ranges = RangeLedger(conf.cni_dir)
        self.locks = locks if locks is not None else ContainerLocks()

    # ---- records -------------------------------------------------------------

    def save_record(self, record: AttachmentRecord) -> None:
        """Save a record, noting the host-local ranges its delegates allocate from."""
        self.ranges.note(d.config for d in record.delegates)
        self.records.save(record)

    def start_sync(
        self,
        container_id: str,
        cache_files: list[Path],
        after: Iterable[fileio.PendingSync] = (),
    ) -> Durability:
        """Start fsyncing the container's record and its result-cache files (and their
        directories), once the writes `after` are done: once wait() returns, a crash
        leaves them whole on disk."""
        return Durability(
            self.conf.cni_dir,
            container_id,
            fileio.start_sync([self.records.path(container_id), *cache_files], after),
        )

    def release_unowned_leases(
        self, valid_ids: set[str], log: StepLogger
    ) -> list[tuple[str, CNIError]]:
        """GC: release the leases of Plexus's host-local ranges held by containers that
        neither the runtime (`valid_ids`) nor a record accounts for, as when a record
        was lost with its pod. Failures are returned, by lease."""
        records, unreadable = self.records.scan()
        errors = []
        for lease in unowned_leases(self.conf, records, {*valid_ids, *unreadable}):
            where = f"{lease.data_dir}/{lease.network}"
            try:
                with (
                    log.step(
                        "gc: release leaked lease",
                        ip=lease.ip,
                        range=where,
                        container=lease.container_id,
                    ),
                    open_store(lease.network, lease.data_dir) as store,
                ):
                    store.release(lease.container_id, lease.ifname)
            except CNIError as exc:
                errors.append((f"lease {lease.ip} in {where}", exc))
        if not unreadable:  # a record that cannot be read may use any range
            in_use = ranges_in_use(self.conf, records)
            held = {(lease.data_dir, lease.network) for lease in range_leases(self.ranges.all())}
            for data_dir, network in self.ranges.forget(in_use | held):
                log.info("gc: range no longer used, forgotten", range=f"{data_dir}/{network}")
        return errors

    # ---- locks and readiness -------------------------------------------------

    @contextmanager
    def lock(self, container_id: str = "", exclusive: bool = False) -> Iterator[None]:
        """GC (`exclusive`) excludes every other call; other calls exclude only GC, and
        calls of one container exclude each other. All of it holds across processes
        (file locks), so thin-mode plugins and a daemon exclude each other too."""
        Path(self.conf.cni_dir).mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(os.path.join(self.conf.cni_dir, "gc.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            with self._container_lock(container_id) if container_id else nullcontext():
                yield
        finally:
            os.close(fd)

    @contextmanager
    def _container_lock(self, container_id: str) -> Iterator[None]:
        path = self._locks_dir / container_id
        with self.locks.hold(container_id):
            path.parent.mkdir(mode=0o700, exist_ok=True)
            with file_lock(path):
                try:
                    yield
                finally:
                    # A container without a record has nothing left to guard: the next
                    # call creates the file again, so lock files live as long as records.
                    if not self.records.exists(container_id):
                        remove_lock_file(path)

    @property
    def _locks_dir(self) -> Path:
        return Path(self.conf.cni_dir) / "locks"

    def remove_stale_lock_files(self) -> None:
        """Remove the lock files of containers without a record (left by a killed call).
        Only under GC's lock: no container lock is held without it."""
        directory = self._locks_dir
        for path in sorted(directory.iterdir()) if directory.is_dir() else []:
            if not self.records.exists(path.name):
                remove_lock_file(path)

    def wait_until_ready(self, log: StepLogger) -> None:
        """Wait for `readinessindicatorfile`; TRY_AGAIN_LATER if it does not appear."""
        path = self.conf.readiness_indicator_file
        if not path:
            return
        deadline = time.monotonic() + READINESS_WAIT_SECONDS
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                raise CNIError(
                    ErrorCode.TRY_AGAIN_LATER,
                    f"the default network is not ready: {path} does not exist "
                    f"(waited {READINESS_WAIT_SECONDS:.0f}s)",
                )
            time.sleep(0.1)
        log.info("readiness indicator present", file=path)

    # ---- pod namespaces ------------------------------------------------------

    @staticmethod
    def netns_exists(path: str) -> bool:
        return netns_exists(path)

    @staticmethod
    def apply_default_routes(netns: str, plan: routes.RoutePlan, log: StepLogger) -> None:
        if plan.empty:
            return
        with log.step("default-route", plan=str(plan)):
            routes.apply_to_netns(netns, plan)

    # ---- device-info files ---------------------------------------------------
    # As Multus: the device plugin's file is copied to the network's CNI file before
    # ADD (best effort), read back after ADD (the delegate may have written it) and
    # removed after DEL.

    def name_device_info_files(self, container_id: str, delegates: list[Delegate]) -> None:
        for delegate in delegates:
            if delegate.device_id:
                path = deviceinfo.cni_path(
                    self.conf.device_info_dir,
                    delegate.network_config().name,
                    container_id,
                    delegate.ifname,
                )
                delegate.capability_args[deviceinfo.CAPABILITY] = str(path)

    def copy_device_info(self, delegate: Delegate, log: StepLogger) -> None:
        path = delegate.capability_args.get(deviceinfo.CAPABILITY)
        if not (path and delegate.resource_name and delegate.device_id):
            return
        try:
            copied = deviceinfo.copy_from_dp(
                self.conf.device_info_dir, delegate.resource_name, delegate.device_id, path
            )
            log.info(
                "device-info copied" if copied else "no device-info from the device plugin",
                network=delegate.network,
                device=delegate.device_id,
            )
        except CNIError as exc:
            log.warning("device-info not copied", network=delegate.network, error=str(exc))

    def load_device_info(self, delegate: Delegate, log: StepLogger) -> dict[str, Any] | None:
        path = delegate.capability_args.get(deviceinfo.CAPABILITY)
        if not (path and delegate.device_id):
            return None
        try:
            return deviceinfo.load(path)
        except CNIError as exc:
            log.warning("device-info not reported", network=delegate.network, error=str(exc))
            return None

    def clean_device_info(self, delegate: Delegate, log: StepLogger) -> None:
        path = delegate.capability_args.get(deviceinfo.CAPABILITY)
        if not isinstance(path, str):
            return
        try:
            deviceinfo.clean(self.conf.device_info_dir, path)
        except CNIError as exc:
            log.warning("device-info not removed", network=delegate.network, error=str(exc))


class Durability:
    """A container's state being synced to disk (Node.start_sync)."""

    def __init__(self, cni_dir: str, container_id: str, pending: fileio.PendingSync) -> None:
        self._where = cni_dir
        self.container_id = container_id
        self._pending = pending

    def wait(self) -> None:
        """Return once the state is on disk; code 5 if the disk refused."""
        try:
            self._pending.wait()
        except OSError as exc:
            raise CNIError(
                ErrorCode.IO_FAILURE,
                f"cannot make the state of container {self.container_id} durable in {self._where}",
                str(exc),
            ) from exc

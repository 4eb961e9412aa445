"""ADD, DEL, CHECK, STATUS and GC across all of a pod's networks.

The engine does no I/O of its own; it touches the world only through its seams: the
cluster source (pods, NADs, network-status, events, and DRA ResourceClaims), the CNI
runtime (delegates and their result cache), the device source (kubelet PodResources) and
the node (attachment records, locks, readiness, device-info files, default routes in the
pod's namespace).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

from cni.cache import CacheEntry
from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from cni.fileio import PendingSync
from cni.logs import StepLogger, call_fields
from cni.result import Result
from cni.runtime import CNIRuntime, RuntimeConf
from cni.version import version_at_least
from meta import routes
from meta.attachments import NetworkNotFound, Resolver, unhonoured_requests
from meta.claims import ClaimedDevices, status_by_claim
from meta.config import MetaConfig
from meta.delegate import Delegate
from meta.devices import DeviceSource
from meta.lanes import IN_ORDER, attach_in_lanes
from meta.node import Node
from meta.records import AttachmentRecord
from meta.sources.base import ClusterSource, Pod
from meta.status import network_statuses, render


class Engine:
    """One meta config's view of the node: resolve, attach, undo, verify."""

    def __init__(
        self,
        conf: MetaConfig,
        source: ClusterSource | None,
        runtime: CNIRuntime,
        node: Node,
        devices: DeviceSource | None = None,
    ) -> None:
        self.conf = conf
        self.source = source
        self.runtime = runtime
        self.node = node
        self.devices = devices
        self.claims = source.claims() if source is not None else None

    # ---- ADD -----------------------------------------------------------------

    def add(self, args: CmdArgs) -> Result:
        log = _call_log("add", args)
        self.node.wait_until_ready(log)
        with self.node.lock(args.container_id):
            self._refuse_second_add(args)
            if not self.node.netns_exists(args.netns):
                raise CNIError(
                    ErrorCode.UNKNOWN_CONTAINER,
                    f"network namespace {args.netns} does not exist",
                    "the sandbox is gone or CNI_NETNS is wrong; nothing was attached",
                )
            pod = self._find_pod(args, log)
            if pod is None and self._pod_expected(args):
                log.warning("pod not found: returning an empty result without attaching anything")
                return Result(cniVersion=self.conf.cni_version)
            claimed = self._claimed(pod)
            delegates = self._resolve(args, pod, log, devices=claimed or self.devices)
            self.node.name_device_info_files(args.container_id, delegates)
            plan = routes.plan_default_routes(delegates)
            self.node.save_record(
                AttachmentRecord(
                    container_id=args.container_id,
                    netns=args.netns,
                    ifname=args.ifname,
                    pod_namespace=pod.namespace if pod else "",
                    pod_name=pod.name if pod else "",
                    pod_uid=pod.uid if pod else "",
                    cni_args=list(args.args),
                    path=list(args.path),
                    delegates=delegates,
                )
            )
            # The delegates' result-cache files are written off this thread
            # (CNIRuntime.add's `writes`); they and the record are synced once the
            # delegates are done (a sync meanwhile slows their own file creation: see
            # fileio.start_sync), while network-status is written: the ADD waits only
            # for what is left of it.
            writes: list[PendingSync] = []
            results = self._attach_all(args, delegates, plan, log, writes)
            state_sync = self.node.start_sync(
                args.container_id, self._cache_files(args, delegates), after=writes
            )
            try:
                self._write_status(pod, delegates, results, log)
                if claimed is not None:
                    self._write_claim_status(claimed, delegates, results, log)
                with log.step("sync state to disk", files=len(delegates) + 1):
                    state_sync.wait()
            except CNIError:
                # A failed sync too: a crash could then lose what this ADD attached.
                self._rollback(args, delegates, log, writes)
                raise
            self._announce(pod, delegates, results)
            self._warn_unhonoured(pod, delegates, results, log)
            default = next(r for d, r in zip(delegates, results, strict=True) if d.default)
            return default.convert(self.conf.cni_version)

    def _claimed(self, pod: Pod | None) -> ClaimedDevices | None:
        """Device IDs from the pod's ResourceClaims before the kubelet's; None (no claim
        is read) for a pod without claims."""
        if self.claims is None or pod is None or not pod.resource_claims:
            return None
        return ClaimedDevices(self.claims, pod, self.devices)

    def _write_claim_status(
        self,
        claimed: ClaimedDevices,
        delegates: list[Delegate],
        results: list[Result],
        log: StepLogger,
    ) -> None:
        """`status.devices` (Ready, networkData) of each claim whose device was attached."""
        assert self.claims is not None
        for (namespace, claim, uid), devices in status_by_claim(
            claimed.attached(delegates, results)
        ).items():
            with log.step("write claim status", claim=f"{namespace}/{claim}", devices=len(devices)):
                self.claims.set_device_status(namespace, claim, uid, devices)

    def _refuse_second_add(self, args: CmdArgs) -> None:
        """The spec forbids a second ADD of one container and interface without a DEL
        between; running it would attach over the first and its rollback would undo the
        first. One record per container, so another ifname is refused the same way."""
        if self.node.records.exists(args.container_id):
            raise CNIError(
                ErrorCode.INVALID_ENV,
                f"container {args.container_id} is already attached "
                f"(record {self.node.records.path(args.container_id)}); "
                f"this ADD of {args.ifname} changed nothing",
                "a runtime must not ADD a container twice without a DEL between (CNI spec); "
                "DEL it first",
            )

    def _cache_files(self, args: CmdArgs, delegates: list[Delegate]) -> list[Path]:
        return [
            self.runtime.cache.path(d.network_config().name, args.container_id, d.ifname)
            for d in delegates
        ]

    def _attach_all(
        self,
        args: CmdArgs,
        delegates: list[Delegate],
        plan: routes.RoutePlan,
        log: StepLogger,
        writes: list[PendingSync],
    ) -> list[Result]:
        outcome = attach_in_lanes(
            delegates,
            lambda d, lane: self._attach(args, d, log, lane, writes),
            self._may_run_beside,
        )
        try:
            if outcome.error is not None:
                raise outcome.error
            self.node.apply_default_routes(args.netns, plan, log)
            if not plan.empty:
                _settle(writes)  # the cache files it rewrites are whole
            return [
                self._rewrite_routes(args, d, r, plan)
                for d, r in zip(delegates, outcome.results, strict=True)
            ]
        except CNIError:
            self._rollback(args, outcome.started, log, writes)
            raise

    def _may_run_beside(self, delegate: Delegate) -> bool:
        """In-process and independent of the pod's other links (meta/lanes.py); a config
        that does not parse runs in order, where its ADD reports the error."""
        try:
            return self.runtime.in_process(delegate.network_config()) and not delegate.links_in_pod
        except CNIError:
            return False

    def _attach(
        self,
        args: CmdArgs,
        delegate: Delegate,
        log: StepLogger,
        lane: str = IN_ORDER,
        writes: list[PendingSync] | None = None,
    ) -> Result:
        with log.step("delegate add", **delegate.log_fields, lane=lane) as fields:
            self.node.copy_device_info(delegate, log)
            try:
                result = self.runtime.add(
                    delegate.network_config(), self._rt(args, delegate), writes
                )
            except CNIError as exc:
                raise CNIError(
                    exc.code, f"ADD of {delegate.label} failed: {exc.msg}", exc.details
                ) from exc
            fields["ips"] = result.ip_strings()
            delegate.device_info = self.node.load_device_info(delegate, log)
            return result

    def _rewrite_routes(
        self, args: CmdArgs, delegate: Delegate, result: Result, plan: routes.RoutePlan
    ) -> Result:
        if delegate.ifname not in plan.strip and delegate.ifname not in plan.gateways:
            return result
        updated = routes.apply_to_result(result, delegate.ifname, plan)
        net = delegate.network_config()
        entry = self.runtime.cache.load(net.name, args.container_id, delegate.ifname)
        if entry is not None:
            entry.result = updated.to_dict(net.cni_version)
            self.runtime.cache.save(entry)
        return updated

    def _rollback(
        self,
        args: CmdArgs,
        delegates: list[Delegate],
        log: StepLogger,
        writes: list[PendingSync] | None = None,
    ) -> None:
        _settle(writes or [])  # a cache file written after its DEL would outlive it
        for delegate in reversed(delegates):
            self._rollback_one(args, delegate, log)
        self.node.records.delete(args.container_id)

    def _rollback_one(self, args: CmdArgs, delegate: Delegate, log: StepLogger) -> None:
        try:
            with log.step("rollback delegate del", **delegate.log_fields):
                self.runtime.delete(delegate.network_config(), self._rt(args, delegate))
        except CNIError:
            pass  # logged by the step
        self.node.clean_device_info(delegate, log)

    def _write_status(
        self, pod: Pod | None, delegates: list[Delegate], results: list[Result], log: StepLogger
    ) -> None:
        if pod is None or self.source is None:
            return
        statuses = []
        for delegate, result in zip(delegates, results, strict=True):
            statuses += network_statuses(
                result, delegate.network, delegate.default, delegate.device_info
            )
        with log.step("write network-status", entries=len(statuses)):
            self.source.set_network_status(pod, render(statuses))

    def _announce(self, pod: Pod | None, delegates: list[Delegate], results: list[Result]) -> None:
        """An `AddedInterface` event per attached interface."""
        if pod is None or self.source is None:
            return
        for delegate, result in zip(delegates, results, strict=True):
            cidrs = [str(ip.address) for ip in result.ips]
            self.source.record_event(
                pod,
                "Normal",
                "AddedInterface",
                f"Add {delegate.ifname} [{','.join(cidrs)}] from {delegate.network}",
            )

    def _warn_unhonoured(
        self, pod: Pod | None, delegates: list[Delegate], results: list[Result], log: StepLogger
    ) -> None:
        """A warning, logged and as an event, for each ips/mac request no plugin honoured."""
        for delegate, result in zip(delegates, results, strict=True):
            for message in unhonoured_requests(delegate, result):
                log.warning("request not honoured", reason=message)
                if pod is not None and self.source is not None:
                    self.source.record_event(pod, "Warning", "IgnoredRequest", message)

    # ---- DEL -----------------------------------------------------------------

    def delete(self, args: CmdArgs) -> None:
        log = _call_log("del", args)
        with self.node.lock(args.container_id):
            delegates, netns = self._delegates_for_delete(args, log)
            errors = self._detach_all(
                args.container_id, netns or args.netns, args.args, delegates, log
            )
            if errors:
                raise _aggregate("DEL", _labelled(errors))
            self._forget(args.container_id)

    def _delegates_for_delete(self, args: CmdArgs, log: StepLogger) -> tuple[list[Delegate], str]:
        record = self._load_record(args.container_id, log)
        if record is not None:
            return record.delegates, args.netns
        entries, unreadable = self.runtime.cache.scan(container_id=args.container_id)
        cached = self._delegates_from_result_cache(entries)
        for path, exc in unreadable.items():
            log.warning(
                "unreadable CNI cache file: removing it, resolving the pod's networks as well",
                file=str(path),
                error=str(exc),
            )
        self.runtime.cache.remove_unreadable(args.container_id)  # nobody can use them
        if cached and not unreadable:
            log.warning(
                "no attachment record: deleting what the result cache holds",
                networks=[d.network for d in cached],
            )
            return cached, args.netns
        delegates = _merge(self._resolve_for_delete(args, log), cached)
        # Usual for a repeated DEL (containerd sends one on stop and one on remove); the
        # DEL still runs so IPs are released if the record was lost (Multus #1087).
        log.info(
            "no attachment record (already deleted, or lost): "
            "deleting the networks resolved from config",
            networks=[d.network for d in delegates],
        )
        return delegates, args.netns

    def _resolve_for_delete(self, args: CmdArgs, log: StepLogger) -> list[Delegate]:
        try:
            pod = self._find_pod(args, log, wait=False)
            return self._resolve(args, pod, log, events=False)
        except CNIError as exc:
            log.warning(
                "no attachment record and the pod's networks cannot be resolved: "
                "deleting the default network only",
                error=str(exc),
            )
            return Resolver(self.conf, None, args.ifname).resolve(None)[:1]

    def _load_record(self, container_id: str, log: StepLogger) -> AttachmentRecord | None:
        """The container's record; None, with a warning, if it is unreadable (a crash cut
        it short): DEL and GC then fall back as they do when it is missing."""
        try:
            return self.node.records.load(container_id)
        except CNIError as exc:
            self._warn_unreadable(container_id, exc, log)
            return None

    def _warn_unreadable(self, container_id: str, exc: CNIError, log: StepLogger) -> None:
        log.warning(
            "unreadable attachment record: treating it as lost",
            file=str(self.node.records.path(container_id)),
            error=exc.details,
        )

    def _cache_entries(self, container_id: str) -> list[CacheEntry]:
        return self.runtime.cache.entries(container_id=container_id)

    def _forget(self, container_id: str) -> None:
        """After a DEL of everything: drop the record, and cache files nobody can read."""
        self.node.records.delete(container_id)
        self.runtime.cache.remove_unreadable(container_id)

    @staticmethod
    def _delegates_from_result_cache(entries: list[CacheEntry]) -> list[Delegate]:
        delegates = []
        for entry in entries:
            try:
                config = json.loads(entry.config)
            except (ValueError, UnicodeDecodeError):
                continue
            delegates.append(
                Delegate(
                    network=entry.network_name,
                    ifname=entry.ifname,
                    config=config,
                    default=False,
                    capability_args=entry.capability_args,
                )
            )
        return delegates

    def _detach_all(
        self,
        container_id: str,
        netns: str,
        cni_args: tuple[tuple[str, str], ...] | list[tuple[str, str]],
        delegates: list[Delegate],
        log: StepLogger,
    ) -> list[tuple[Delegate, CNIError]]:
        errors = []
        for delegate in reversed(delegates):
            rt = RuntimeConf(
                container_id, netns, delegate.ifname, tuple(cni_args), delegate.capability_args
            )
            attempts = 2 if self.conf.retry_delete_on_error else 1
            for attempt in range(1, attempts + 1):
                try:
                    with log.step("delegate del", **delegate.log_fields, attempt=attempt):
                        self.runtime.delete(delegate.network_config(), rt)
                    break
                except CNIError as exc:
                    if attempt == attempts:
                        errors.append((delegate, exc))
            self.node.clean_device_info(delegate, log)
        return errors

    # ---- hot-plug --------------------------------------------------------------

    def sync(self, container_id: str) -> bool:
        """Hot-plug: attach and detach a running container's secondary networks so they
        match its pod's annotation now, then rewrite network-status.

        An attachment of a network the annotation still asks for stays as it is (an
        automatic `netN` name never moves it); a new one without a name the pod chose gets
        the lowest free `netN`.
        The record is saved before each new delegate runs, as ADD does. The default
        network, default routes and device-plugin resources (allocated only when the pod
        starts) are never changed here. False when there was nothing to do: no record,
        the namespace or the pod gone, or the annotation already matched.
        """
        log = StepLogger("engine", verb="sync", cid=container_id[:12])
        with self.node.lock(container_id):
            record = self._load_record(container_id, log)
            if record is None or self.source is None or not record.pod_name:
                return False
            if not self.node.netns_exists(record.netns):
                return False
            pod = self.source.get_pod(
                record.pod_namespace or "default", record.pod_name, wait=False
            )
            if pod is None or (record.pod_uid and pod.uid and pod.uid != record.pod_uid):
                return False
            log = log.bind(pod=f"{pod.namespace}/{pod.name}")
            args = CmdArgs(
                "ADD",
                container_id,
                record.netns,
                record.ifname,
                tuple(record.cni_args),
                tuple(record.path),
                b"",
            )
            try:
                wanted = self._resolve(args, pod, log)
            except CNIError as exc:
                self.source.record_event(pod, "Warning", "HotplugFailed", exc.msg)
                return False
            added, removed, refused = _hotplug_plan(record.delegates, wanted)
            for message in refused:
                log.warning("hot-plug refused", reason=message)
                self.source.record_event(pod, "Warning", "HotplugFailed", message)
            if not added and not removed:
                return False
            return self._hotplug(pod, record, args, added, removed, log)

    def _hotplug(
        self,
        pod: Pod,
        record: AttachmentRecord,
        args: CmdArgs,
        added: list[Delegate],
        removed: list[Delegate],
        log: StepLogger,
    ) -> bool:
        assert self.source is not None
        errors = self._detach_all(args.container_id, args.netns, args.args, removed, log)
        still_there = {id(d) for d, _ in errors}
        for delegate, exc in errors:
            self.source.record_event(
                pod, "Warning", "HotplugFailed", f"remove {delegate.label}: {exc.msg}"
            )
        gone = [d for d in removed if id(d) not in still_there]
        current = [d for d in record.delegates if not any(d is g for g in gone)]
        record.delegates = current
        self.node.save_record(record)
        for delegate in gone:
            message = f"Remove {delegate.ifname} from {delegate.network}"
            self.source.record_event(pod, "Normal", "RemovedInterface", message)
        fresh: dict[int, Result] = {}  # id(delegate) -> its ADD result
        for delegate in added:
            record.delegates = [*current, delegate]
            self.node.save_record(record)
            try:
                fresh[id(delegate)] = self._attach(args, delegate, log)
            except CNIError as exc:
                self._rollback_one(args, delegate, log)
                record.delegates = current
                self.node.save_record(record)
                self.source.record_event(pod, "Warning", "HotplugFailed", exc.msg)
                continue
            current = record.delegates
        results = [(d, fresh.get(id(d)) or self._cached(args.container_id, d)) for d in current]
        known = [(d, r) for d, r in results if r is not None]
        self._write_status(pod, [d for d, _ in known], [r for _, r in known], log)
        new = [d for d in current if id(d) in fresh]
        self._announce(pod, new, [fresh[id(d)] for d in new])
        self._warn_unhonoured(pod, new, [fresh[id(d)] for d in new], log)
        return True

    def _cached(self, container_id: str, delegate: Delegate) -> Result | None:
        """An attachment's result from the result cache, None if it has none."""
        try:
            entry = self.runtime.cache.load(
                delegate.network_config().name, container_id, delegate.ifname
            )
            return Result.from_dict(entry.result) if entry and entry.result else None
        except CNIError:
            return None

    # ---- CHECK ---------------------------------------------------------------

    def check(self, args: CmdArgs) -> None:
        log = _call_log("check", args)
        with self.node.lock(args.container_id):
            record = self.node.records.load(args.container_id)
            if record is None:
                raise CNIError(
                    ErrorCode.UNKNOWN_CONTAINER,
                    f"CHECK: no attachment record for container {args.container_id}",
                )
            errors = []
            for delegate in record.delegates:
                net = delegate.network_config()
                if not version_at_least(net.cni_version, "0.4.0"):
                    log.info(
                        "delegate check skipped: cniVersion below 0.4.0",
                        network=delegate.network,
                        ifname=delegate.ifname,
                    )
                    continue
                try:
                    with log.step("delegate check", **delegate.log_fields):
                        self.runtime.check(net, self._rt(args, delegate))
                except CNIError as exc:
                    errors.append((delegate, exc))
            if errors:
                raise _aggregate("CHECK", _labelled(errors))

    # ---- STATUS --------------------------------------------------------------

    def status(self, args: CmdArgs) -> None:
        """Ready when the default network is; secondary problems are only logged."""
        log = _call_log("status", args)
        delegates = self._static_networks()
        default = delegates[0]
        with log.step("default network status", network=default.network, delegate=default.chain):
            self.runtime.status(default.network_config())
        for delegate in delegates[1:]:
            try:
                self.runtime.status(delegate.network_config())
            except CNIError as exc:
                log.warning(
                    "secondary network not ready (node stays Ready)",
                    network=delegate.network,
                    error=str(exc),
                )

    def _static_networks(self) -> list[Delegate]:
        resolver = Resolver(self.conf, self.source, "eth0")
        if self.conf.delegates:
            return resolver.resolve(None)
        cluster = resolver.resolve(None)[:1]
        return cluster + [
            resolver.named_delegate(ref, i + 1) for i, ref in enumerate(self.conf.default_networks)
        ]

    # ---- GC ------------------------------------------------------------------

    def gc(self, args: CmdArgs) -> None:
        """DEL every attachment the runtime no longer lists (recorded, or with an
        unreadable record), GC every network, then release the host-local leases that
        nothing owns any more (what `plexus inspect` reports as leaked)."""
        log = _call_log("gc", args)
        valid = _valid_attachments(self.conf)
        valid_ids = {cid for cid, _ in valid}
        errors: list[tuple[str, CNIError]] = []
        with self.node.lock(exclusive=True):
            records, unreadable = self.node.records.scan()
            kept: list[tuple[str, list[Delegate]]] = []
            for record in records:
                if (record.container_id, record.ifname) in valid:
                    kept.append((record.container_id, record.delegates))
                    continue
                errors += self._gc_stale(
                    record.container_id, record.netns, record.cni_args, record.delegates, log
                )
            for container_id, exc in unreadable.items():
                self._warn_unreadable(container_id, exc, log)
                entries = self._cache_entries(container_id)
                delegates = self._delegates_from_result_cache(entries)
                if container_id in valid_ids:
                    kept.append((container_id, delegates))
                    continue
                netns, cni_args = (entries[0].netns, entries[0].cni_args) if entries else ("", [])
                errors += self._gc_stale(container_id, netns, cni_args, delegates, log)
            for delegate, attachments in self._networks_to_gc(kept):
                try:
                    with log.step(
                        "delegate gc",
                        network=delegate.network,
                        delegate=delegate.chain,
                        valid=len(attachments),
                    ):
                        self.runtime.gc(delegate.network_config(), attachments)
                except CNIError as exc:
                    errors.append((delegate.label, exc))
            errors += self.node.release_unowned_leases(valid_ids, log)
            self.node.remove_stale_lock_files()
        if errors:
            raise _aggregate("GC", errors)

    def _gc_stale(
        self,
        container_id: str,
        netns: str,
        cni_args: list[tuple[str, str]],
        delegates: list[Delegate],
        log: StepLogger,
    ) -> list[tuple[str, CNIError]]:
        """DEL a container the runtime no longer lists; its record goes once all succeed."""
        log.info(
            "gc: removing stale attachment",
            container=container_id,
            networks=[d.network for d in delegates],
        )
        failed = self._detach_all(container_id, netns, cni_args, delegates, log)
        if not failed:
            self._forget(container_id)
        return _labelled(failed)

    def _networks_to_gc(
        self, kept: list[tuple[str, list[Delegate]]]
    ) -> list[tuple[Delegate, list[tuple[str, str]]]]:
        """Each known network once, with the attachments still valid on it."""
        by_name: dict[str, tuple[Delegate, list[tuple[str, str]]]] = {}
        for delegate in self._static_networks():
            by_name.setdefault(delegate.network_config().name, (delegate, []))
        for container_id, delegates in kept:
            for delegate in delegates:
                name = delegate.network_config().name
                entry = by_name.setdefault(name, (delegate, []))
                entry[1].append((container_id, delegate.ifname))
        return list(by_name.values())

    # ---- shared --------------------------------------------------------------

    def _rt(self, args: CmdArgs, delegate: Delegate) -> RuntimeConf:
        return RuntimeConf(
            args.container_id,
            args.netns,
            delegate.ifname,
            delegate.runtime_args(args.args),
            delegate.capability_args,
        )

    def _pod_expected(self, args: CmdArgs) -> bool:
        return self.source is not None and bool(args.arg("K8S_POD_NAME"))

    def _find_pod(self, args: CmdArgs, log: StepLogger, wait: bool = True) -> Pod | None:
        namespace, name = args.arg("K8S_POD_NAMESPACE") or "", args.arg("K8S_POD_NAME") or ""
        if self.source is None or not name:
            return None
        with log.step("get pod"):
            pod = self.source.get_pod(namespace or "default", name, wait)
        uid = args.arg("K8S_POD_UID") or ""
        if pod is not None and uid and pod.uid and uid != pod.uid and not pod.static:
            raise CNIError(
                ErrorCode.UNKNOWN_CONTAINER,
                f"pod {namespace}/{name}: the runtime's K8S_POD_UID {uid} is not the UID of the "
                f"pod now stored ({pod.uid}); this sandbox belongs to an older pod of that name",
            )
        return pod

    def _resolve(
        self,
        args: CmdArgs,
        pod: Pod | None,
        log: StepLogger,
        events: bool = True,
        devices: DeviceSource | None = None,
    ) -> list[Delegate]:
        """The pod's delegates; device IDs are looked up only when `devices` is given (ADD)."""
        try:
            with log.step("resolve networks") as fields:
                resolver = Resolver(self.conf, self.source, args.ifname, devices)
                delegates = resolver.resolve(pod)
                fields["networks"] = [f"{d.network}@{d.ifname}" for d in delegates]
                return delegates
        except NetworkNotFound as exc:
            if events and pod is not None and self.source is not None:
                self.source.record_event(pod, "Warning", "NoNetworkFound", str(exc))
            raise


def _settle(writes: list[PendingSync]) -> None:
    """Wait until the background cache writes are done, whatever their outcome."""
    for pending in writes:
        with contextlib.suppress(OSError):
            pending.wait()


def _call_log(verb: str, args: CmdArgs) -> StepLogger:
    return StepLogger("engine", verb=verb, **call_fields(args.container_id, dict(args.args)))


def _valid_attachments(conf: MetaConfig) -> set[tuple[str, str]]:
    extra = conf.model_extra or {}
    raw = extra.get("cni.dev/valid-attachments", extra.get("cni.dev/attachments", []))
    if not isinstance(raw, list):
        raise CNIError(ErrorCode.INVALID_CONFIG, "cni.dev/valid-attachments must be a list")
    valid = set()
    for item in raw:
        if not isinstance(item, dict) or "containerID" not in item or "ifname" not in item:
            raise CNIError(
                ErrorCode.INVALID_CONFIG,
                f"cni.dev/valid-attachments: {item!r} lacks containerID or ifname",
            )
        valid.add((str(item["containerID"]), str(item["ifname"])))
    return valid


def _hotplug_plan(
    have: list[Delegate], wanted: list[Delegate]
) -> tuple[list[Delegate], list[Delegate], list[str]]:
    """(to attach, to detach, refusals) for the secondaries of a running container."""
    free = [d for d in have if not d.default]
    added: list[Delegate] = []
    refused: list[str] = []
    for want in (w for w in wanted if not w.default):
        match = next(
            (
                d
                for d in free
                if d.network == want.network and (d.ifname == want.ifname or not want.ifname_chosen)
            ),
            None,
        )
        if match is not None:
            free = [d for d in free if d is not match]
        elif want.resource_name:
            refused.append(
                f"cannot hot-plug {want.label}: it needs a {want.resource_name} device, "
                "and devices are allocated only when the pod starts"
            )
        else:
            added.append(want)
    used = {d.ifname for d in have if not any(d is f for f in free)}
    placed: list[Delegate] = []
    for want in added:
        name = want.ifname
        if name in used and not want.ifname_chosen:
            name = next(f"net{n}" for n in range(1, len(used) + 2) if f"net{n}" not in used)
        if name in used:
            refused.append(f"cannot hot-plug {want.label}: interface {name} is taken")
            continue
        used.add(name)
        placed.append(want if name == want.ifname else want.model_copy(update={"ifname": name}))
    return placed, free, refused


def _merge(resolved: list[Delegate], cached: list[Delegate]) -> list[Delegate]:
    """The resolved delegates, each replaced by its cached twin (the config its ADD ran),
    then the cached ones nothing resolves to any more."""

    def key(d: Delegate) -> tuple[str, str]:
        return d.network_config().name, d.ifname

    twins = {key(d): d for d in cached}
    merged = [twins.pop(key(d), d) for d in resolved]
    return merged + list(twins.values())


def _labelled(errors: list[tuple[Delegate, CNIError]]) -> list[tuple[str, CNIError]]:
    return [(d.label, e) for d, e in errors]


def _aggregate(verb: str, errors: list[tuple[str, CNIError]]) -> CNIError:
    messages = [f"{label}: {e}" for label, e in errors]
    return CNIError(
        errors[0][1].code, f"{verb} failed for {len(errors)} network(s)", "; ".join(messages)
    )

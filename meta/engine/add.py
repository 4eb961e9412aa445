"""ADD: attach every network the pod asks for, tell the cluster, undo it all on a failure."""

from __future__ import annotations

import contextlib
from pathlib import Path

from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from cni.fileio import PendingSync
from cni.logs import StepLogger
from cni.result import Result
from meta import routes
from meta.attachments import unhonoured_requests
from meta.claims import ClaimedDevices, status_by_claim
from meta.delegate import Delegate
from meta.engine.core import Core, call_log
from meta.lanes import IN_ORDER, attach_in_lanes
from meta.records import AttachmentRecord
from meta.sources.base import Pod
from meta.status import network_statuses, render


def add(core: Core, args: CmdArgs) -> Result:
    log = call_log("add", args)
    core.node.wait_until_ready(log)
    with core.node.lock(args.container_id):
        _refuse_second_add(core, args)
        if not core.node.netns_exists(args.netns):
            raise CNIError(
                ErrorCode.UNKNOWN_CONTAINER,
                f"network namespace {args.netns} does not exist",
                "the sandbox is gone or CNI_NETNS is wrong; nothing was attached",
            )
        pod = core.find_pod(args, log)
        if pod is None and core.pod_expected(args):
            log.warning("pod not found: returning an empty result without attaching anything")
            return Result(cniVersion=core.conf.cni_version)
        claimed = _claimed(core, pod)
        delegates = core.resolve(args, pod, log, devices=claimed or core.devices)
        _refuse_unnameable(core, args, delegates)
        core.node.name_device_info_files(args.container_id, delegates)
        plan = routes.plan_default_routes(delegates)
        core.node.save_record(
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
        results = _attach_all(core, args, delegates, plan, log, writes)
        state_sync = core.node.start_sync(
            args.container_id, _cache_files(core, args, delegates), after=writes
        )
        try:
            write_status(core, pod, delegates, results, log)
            if claimed is not None:
                _write_claim_status(core, claimed, delegates, results, log)
            with log.step("sync state to disk", files=len(delegates) + 1):
                state_sync.wait()
        except CNIError:
            # A failed sync too: a crash could then lose what this ADD attached.
            _rollback(core, args, delegates, log, writes)
            raise
        announce(core, pod, delegates, results)
        warn_unhonoured(core, pod, delegates, results, log)
        default = next(r for d, r in zip(delegates, results, strict=True) if d.default)
        return default.convert(core.conf.cni_version)


def _claimed(core: Core, pod: Pod | None) -> ClaimedDevices | None:
    """Device IDs from the pod's ResourceClaims before the kubelet's; None (no claim
    is read) for a pod without claims."""
    if core.claims is None or pod is None or not pod.resource_claims:
        return None
    return ClaimedDevices(core.claims, pod, core.devices)


def _write_claim_status(
    core: Core,
    claimed: ClaimedDevices,
    delegates: list[Delegate],
    results: list[Result],
    log: StepLogger,
) -> None:
    """`status.devices` (Ready, networkData) of each claim whose device was attached."""
    assert core.claims is not None
    for (namespace, claim, uid), devices in status_by_claim(
        claimed.attached(delegates, results)
    ).items():
        with log.step("write claim status", claim=f"{namespace}/{claim}", devices=len(devices)):
            core.claims.set_device_status(namespace, claim, uid, devices)


def _refuse_second_add(core: Core, args: CmdArgs) -> None:
    """The spec forbids a second ADD of one container and interface without a DEL
    between; running it would attach over the first and its rollback would undo the
    first. One record per container, so another ifname is refused the same way."""
    if core.node.records.exists(args.container_id):
        raise CNIError(
            ErrorCode.INVALID_ENV,
            f"container {args.container_id} is already attached "
            f"(record {core.node.records.path(args.container_id)}); "
            f"this ADD of {args.ifname} changed nothing",
            "a runtime must not ADD a container twice without a DEL between (CNI spec); "
            "DEL it first",
        )


def _refuse_unnameable(core: Core, args: CmdArgs, delegates: list[Delegate]) -> None:
    """Before anything is attached: CNIError if a network's result-cache file cannot be
    named (its config's name, the container ID and the ifname: too long for a file)."""
    for d in delegates:
        name = d.config.get("name")
        if isinstance(name, str) and name:  # else the network fails on its own
            core.runtime.cache.path(name, args.container_id, d.ifname)


def _cache_files(core: Core, args: CmdArgs, delegates: list[Delegate]) -> list[Path]:
    return [
        core.runtime.cache.path(d.network_config().name, args.container_id, d.ifname)
        for d in delegates
    ]


def _attach_all(
    core: Core,
    args: CmdArgs,
    delegates: list[Delegate],
    plan: routes.RoutePlan,
    log: StepLogger,
    writes: list[PendingSync],
) -> list[Result]:
    outcome = attach_in_lanes(
        delegates,
        lambda d, lane: attach(core, args, d, log, lane, writes),
        lambda d: _may_run_beside(core, d),
    )
    try:
        if outcome.error is not None:
            raise outcome.error
        core.node.apply_default_routes(args.netns, plan, log)
        if not plan.empty:
            _settle(writes)  # the cache files it rewrites are whole
        return [
            _rewrite_routes(core, args, d, r, plan)
            for d, r in zip(delegates, outcome.results, strict=True)
        ]
    except CNIError:
        _rollback(core, args, outcome.started, log, writes)
        raise


def _may_run_beside(core: Core, delegate: Delegate) -> bool:
    """In-process and independent of the pod's other links (meta/lanes.py); a config
    that does not parse runs in order, where its ADD reports the error."""
    try:
        return core.runtime.in_process(delegate.network_config()) and not delegate.links_in_pod
    except CNIError:
        return False


def attach(
    core: Core,
    args: CmdArgs,
    delegate: Delegate,
    log: StepLogger,
    lane: str = IN_ORDER,
    writes: list[PendingSync] | None = None,
) -> Result:
    """One delegate's ADD, with its device-info file; the error names the delegate."""
    with log.step("delegate add", **delegate.log_fields, lane=lane) as fields:
        core.node.copy_device_info(delegate, log)
        try:
            result = core.runtime.add(
                delegate.network_config(), core.runtime_conf(args, delegate), writes
            )
        except CNIError as exc:
            raise CNIError(
                exc.code, f"ADD of {delegate.label} failed: {exc.msg}", exc.details
            ) from exc
        fields["ips"] = result.ip_strings()
        delegate.device_info = core.node.load_device_info(delegate, log)
        return result


def _rewrite_routes(
    core: Core, args: CmdArgs, delegate: Delegate, result: Result, plan: routes.RoutePlan
) -> Result:
    if delegate.ifname not in plan.strip and delegate.ifname not in plan.gateways:
        return result
    updated = routes.apply_to_result(result, delegate.ifname, plan)
    net = delegate.network_config()
    entry = core.runtime.cache.load(net.name, args.container_id, delegate.ifname)
    if entry is not None:
        entry.result = updated.to_dict(net.cni_version)
        core.runtime.cache.save(entry)
    return updated


def _rollback(
    core: Core,
    args: CmdArgs,
    delegates: list[Delegate],
    log: StepLogger,
    writes: list[PendingSync] | None = None,
) -> None:
    _settle(writes or [])  # a cache file written after its DEL would outlive it
    for delegate in reversed(delegates):
        rollback_one(core, args, delegate, log)
    core.node.records.delete(args.container_id)


def rollback_one(core: Core, args: CmdArgs, delegate: Delegate, log: StepLogger) -> None:
    """DEL a delegate whose ADD was started, and drop its device-info file."""
    try:
        with log.step("rollback delegate del", **delegate.log_fields):
            core.runtime.delete(delegate.network_config(), core.runtime_conf(args, delegate))
    except CNIError:
        pass  # logged by the step
    core.node.clean_device_info(delegate, log)


def write_status(
    core: Core, pod: Pod | None, delegates: list[Delegate], results: list[Result], log: StepLogger
) -> None:
    """The pod's network-status annotation, one entry per interface of `results`."""
    if pod is None or core.source is None:
        return
    statuses = []
    for delegate, result in zip(delegates, results, strict=True):
        statuses += network_statuses(
            result, delegate.network, delegate.default, delegate.device_info
        )
    with log.step("write network-status", entries=len(statuses)):
        core.source.set_network_status(pod, render(statuses))


def announce(core: Core, pod: Pod | None, delegates: list[Delegate], results: list[Result]) -> None:
    """An `AddedInterface` event per attached interface."""
    if pod is None or core.source is None:
        return
    for delegate, result in zip(delegates, results, strict=True):
        cidrs = [str(ip.address) for ip in result.ips]
        core.source.record_event(
            pod,
            "Normal",
            "AddedInterface",
            f"Add {delegate.ifname} [{','.join(cidrs)}] from {delegate.network}",
        )


def warn_unhonoured(
    core: Core, pod: Pod | None, delegates: list[Delegate], results: list[Result], log: StepLogger
) -> None:
    """A warning, logged and as an event, for each ips/mac request no plugin honoured."""
    for delegate, result in zip(delegates, results, strict=True):
        for message in unhonoured_requests(delegate, result):
            log.warning("request not honoured", reason=message)
            if pod is not None and core.source is not None:
                core.source.record_event(pod, "Warning", "IgnoredRequest", message)


def _settle(writes: list[PendingSync]) -> None:
    """Wait until the background cache writes are done, whatever their outcome."""
    for pending in writes:
        with contextlib.suppress(OSError):
            pending.wait()

"""Hot-plug: a running container's secondary networks follow its pod's annotation."""

from __future__ import annotations

from cni.env import CmdArgs
from cni.errors import CNIError
from cni.logs import StepLogger
from cni.result import Result
from meta.delegate import Delegate
from meta.engine.add import announce, attach, rollback_one, warn_unhonoured, write_status
from meta.engine.core import Core
from meta.engine.delete import detach_all
from meta.records import AttachmentRecord
from meta.sources.base import Pod


def sync(core: Core, container_id: str) -> bool:
    """Attach and detach a running container's secondary networks so they match its
    pod's annotation now, then rewrite network-status.

    An attachment of a network the annotation still asks for stays as it is (an
    automatic `netN` name never moves it); a new one without a name the pod chose gets
    the lowest free `netN`.
    The record is saved before each new delegate runs, as ADD does. The default
    network, default routes and device-plugin resources (allocated only when the pod
    starts) are never changed here. False when there was nothing to do: no record,
    the namespace or the pod gone, or the annotation already matched.
    """
    log = StepLogger("engine", verb="sync", cid=container_id[:12])
    with core.node.lock(container_id):
        record = core.load_record(container_id, log)
        if record is None or core.source is None or not record.pod_name:
            return False
        if not core.node.netns_exists(record.netns):
            return False
        pod = core.source.get_pod(record.pod_namespace or "default", record.pod_name, wait=False)
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
            wanted = core.resolve(args, pod, log)
        except CNIError as exc:
            core.source.record_event(pod, "Warning", "HotplugFailed", exc.msg)
            return False
        added, removed, refused = _plan(record.delegates, wanted)
        for message in refused:
            log.warning("hot-plug refused", reason=message)
            core.source.record_event(pod, "Warning", "HotplugFailed", message)
        if not added and not removed:
            return False
        return _apply(core, pod, record, args, added, removed, log)


def _apply(
    core: Core,
    pod: Pod,
    record: AttachmentRecord,
    args: CmdArgs,
    added: list[Delegate],
    removed: list[Delegate],
    log: StepLogger,
) -> bool:
    assert core.source is not None
    errors = detach_all(core, args.container_id, args.netns, args.args, removed, log)
    still_there = {id(d) for d, _ in errors}
    for delegate, exc in errors:
        core.source.record_event(
            pod, "Warning", "HotplugFailed", f"remove {delegate.label}: {exc.msg}"
        )
    gone = [d for d in removed if id(d) not in still_there]
    current = [d for d in record.delegates if not any(d is g for g in gone)]
    record.delegates = current
    core.node.save_record(record)
    for delegate in gone:
        message = f"Remove {delegate.ifname} from {delegate.network}"
        core.source.record_event(pod, "Normal", "RemovedInterface", message)
    fresh: dict[int, Result] = {}  # id(delegate) -> its ADD result
    for delegate in added:
        record.delegates = [*current, delegate]
        core.node.save_record(record)
        try:
            fresh[id(delegate)] = attach(core, args, delegate, log)
        except CNIError as exc:
            rollback_one(core, args, delegate, log)
            record.delegates = current
            core.node.save_record(record)
            core.source.record_event(pod, "Warning", "HotplugFailed", exc.msg)
            continue
        current = record.delegates
    results = [(d, fresh.get(id(d)) or _cached(core, args.container_id, d)) for d in current]
    known = [(d, r) for d, r in results if r is not None]
    write_status(core, pod, [d for d, _ in known], [r for _, r in known], log)
    new = [d for d in current if id(d) in fresh]
    announce(core, pod, new, [fresh[id(d)] for d in new])
    warn_unhonoured(core, pod, new, [fresh[id(d)] for d in new], log)
    return True


def _cached(core: Core, container_id: str, delegate: Delegate) -> Result | None:
    """An attachment's result from the result cache, None if it has none."""
    try:
        entry = core.runtime.cache.load(
            delegate.network_config().name, container_id, delegate.ifname
        )
        return Result.from_dict(entry.result) if entry and entry.result else None
    except CNIError:
        return None


def _plan(
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

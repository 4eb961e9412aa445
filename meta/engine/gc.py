"""GC: DEL what the runtime no longer lists, GC every network, release leaked leases."""

from __future__ import annotations

from cni.env import CmdArgs
from cni.errors import CNIError, ErrorCode
from cni.logs import StepLogger
from meta.config import MetaConfig
from meta.delegate import Delegate
from meta.engine.core import Core, aggregate, call_log, labelled
from meta.engine.delete import delegates_from_result_cache, detach_all, forget


def gc(core: Core, args: CmdArgs) -> None:
    """DEL every attachment the runtime no longer lists (recorded, or with an
    unreadable record), GC every network, then release the host-local leases that
    nothing owns any more (what `plexus inspect` reports as leaked)."""
    log = call_log("gc", args)
    valid = _valid_attachments(core.conf)
    valid_ids = {cid for cid, _ in valid}
    errors: list[tuple[str, CNIError]] = []
    with core.node.lock(exclusive=True):
        records, unreadable = core.node.records.scan()
        kept: list[tuple[str, list[Delegate]]] = []
        for record in records:
            if (record.container_id, record.ifname) in valid:
                kept.append((record.container_id, record.delegates))
                continue
            errors += _gc_stale(
                core, record.container_id, record.netns, record.cni_args, record.delegates, log
            )
        for container_id, exc in unreadable.items():
            core.warn_unreadable(container_id, exc, log)
            entries = core.runtime.cache.entries(container_id=container_id)
            delegates = delegates_from_result_cache(entries)
            if container_id in valid_ids:
                kept.append((container_id, delegates))
                continue
            netns, cni_args = (entries[0].netns, entries[0].cni_args) if entries else ("", [])
            errors += _gc_stale(core, container_id, netns, cni_args, delegates, log)
        for delegate, attachments in _networks_to_gc(core, kept):
            try:
                with log.step(
                    "delegate gc",
                    network=delegate.network,
                    delegate=delegate.chain,
                    valid=len(attachments),
                ):
                    core.runtime.gc(delegate.network_config(), attachments)
            except CNIError as exc:
                errors.append((delegate.label, exc))
        errors += core.node.release_unowned_leases(valid_ids, log)
        core.node.remove_stale_lock_files()
    if errors:
        raise aggregate("GC", errors)


def _gc_stale(
    core: Core,
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
    failed = detach_all(core, container_id, netns, cni_args, delegates, log)
    if not failed:
        forget(core, container_id)
    return labelled(failed)


def _networks_to_gc(
    core: Core, kept: list[tuple[str, list[Delegate]]]
) -> list[tuple[Delegate, list[tuple[str, str]]]]:
    """Each known network once, with the attachments still valid on it."""
    by_name: dict[str, tuple[Delegate, list[tuple[str, str]]]] = {}
    for delegate in core.static_networks():
        by_name.setdefault(delegate.network_config().name, (delegate, []))
    for container_id, delegates in kept:
        for delegate in delegates:
            name = delegate.network_config().name
            entry = by_name.setdefault(name, (delegate, []))
            entry[1].append((container_id, delegate.ifname))
    return list(by_name.values())


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

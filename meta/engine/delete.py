"""DEL: detach a container's networks, last first, from its record; without one (lost,
or a repeated DEL) from the result cache and the networks its pod resolves to."""

from __future__ import annotations

from cni import jsonio
from cni.cache import CacheEntry
from cni.env import CmdArgs
from cni.errors import CNIError
from cni.logs import StepLogger
from cni.runtime import RuntimeConf
from meta.attachments import Resolver
from meta.delegate import Delegate
from meta.engine.core import Core, aggregate, call_log, labelled


def delete(core: Core, args: CmdArgs) -> None:
    log = call_log("del", args)
    with core.node.lock(args.container_id):
        delegates, netns = _delegates_for_delete(core, args, log)
        errors = detach_all(core, args.container_id, netns or args.netns, args.args, delegates, log)
        if errors:
            raise aggregate("DEL", labelled(errors))
        forget(core, args.container_id)


def _delegates_for_delete(core: Core, args: CmdArgs, log: StepLogger) -> tuple[list[Delegate], str]:
    record = core.load_record(args.container_id, log)
    if record is not None:
        return record.delegates, args.netns
    entries, unreadable = core.runtime.cache.scan(container_id=args.container_id)
    cached = delegates_from_result_cache(entries)
    for path, exc in unreadable.items():
        log.warning(
            "unreadable CNI cache file: removing it, resolving the pod's networks as well",
            file=str(path),
            error=str(exc),
        )
    core.runtime.cache.remove_unreadable(args.container_id)  # nobody can use them
    if cached and not unreadable:
        log.warning(
            "no attachment record: deleting what the result cache holds",
            networks=[d.network for d in cached],
        )
        return cached, args.netns
    delegates = _merge(_resolve_for_delete(core, args, log), cached)
    # Usual for a repeated DEL (containerd sends one on stop and one on remove); the
    # DEL still runs so IPs are released if the record was lost (Multus #1087).
    log.info(
        "no attachment record (already deleted, or lost): "
        "deleting the networks resolved from config",
        networks=[d.network for d in delegates],
    )
    return delegates, args.netns


def _resolve_for_delete(core: Core, args: CmdArgs, log: StepLogger) -> list[Delegate]:
    try:
        pod = core.find_pod(args, log, wait=False)
        return core.resolve(args, pod, log, events=False)
    except CNIError as exc:
        log.warning(
            "no attachment record and the pod's networks cannot be resolved: "
            "deleting the default network only",
            error=str(exc),
        )
        return Resolver(core.conf, None, args.ifname).resolve(None)[:1]


def forget(core: Core, container_id: str) -> None:
    """After a DEL of everything: drop the record, and cache files nobody can read."""
    core.node.records.delete(container_id)
    core.runtime.cache.remove_unreadable(container_id)


def delegates_from_result_cache(entries: list[CacheEntry]) -> list[Delegate]:
    """A delegate for each cache entry whose config parses (the config its ADD ran)."""
    delegates = []
    for entry in entries:
        try:
            config = jsonio.loads(entry.config, f"the cached config of {entry.network_name}")
        except ValueError:
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


def detach_all(
    core: Core,
    container_id: str,
    netns: str,
    cni_args: tuple[tuple[str, str], ...] | list[tuple[str, str]],
    delegates: list[Delegate],
    log: StepLogger,
) -> list[tuple[Delegate, CNIError]]:
    """DEL each delegate, last first (twice with retryDeleteOnError); the ones that failed."""
    errors = []
    for delegate in reversed(delegates):
        rt = RuntimeConf(
            container_id, netns, delegate.ifname, tuple(cni_args), delegate.capability_args
        )
        attempts = 2 if core.conf.retry_delete_on_error else 1
        for attempt in range(1, attempts + 1):
            try:
                with log.step("delegate del", **delegate.log_fields, attempt=attempt):
                    core.runtime.delete(delegate.network_config(), rt)
                break
            except CNIError as exc:
                if attempt == attempts:
                    errors.append((delegate, exc))
        core.node.clean_device_info(delegate, log)
    return errors


def _merge(resolved: list[Delegate], cached: list[Delegate]) -> list[Delegate]:
    """The resolved delegates, each replaced by its cached twin (the config its ADD ran),
    then the cached ones nothing resolves to any more."""

    def key(d: Delegate) -> tuple[str, str]:
        return d.network_config().name, d.ifname

    twins = {key(d): d for d in cached}
    merged = [twins.pop(key(d), d) for d in resolved]
    return merged + list(twins.values())

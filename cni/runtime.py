"""Drive a network configuration through its plugins, as libcni's CNIConfig does."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cni import jsonio
from cni.cache import CacheEntry, ResultCache
from cni.config import NetworkConfigList, plugin_stdin
from cni.env import cni_env
from cni.errors import CNIError, ErrorCode
from cni.fileio import PendingSync
from cni.invoke import ExecExecutor, Executor
from cni.logs import StepLogger, call_fields
from cni.result import Result
from cni.version import STATUS_VERSION, version_at_least

VALID_ATTACHMENTS_KEY = "cni.dev/valid-attachments"
LEGACY_ATTACHMENTS_KEY = "cni.dev/attachments"
"""The key the spec first named; libcni sends both."""


@dataclass(frozen=True)
class RuntimeConf:
    """One attachment: which container, namespace and interface, plus per-call arguments."""

    container_id: str
    netns: str
    ifname: str
    args: tuple[tuple[str, str], ...] = ()
    capability_args: Mapping[str, Any] = field(default_factory=dict)


class CNIRuntime:
    """Runs ADD/CHECK/DEL/STATUS/GC for network configs and keeps libcni's result cache."""

    def __init__(
        self, paths: Sequence[str], cache_dir: str | Path, executor: Executor | None = None
    ) -> None:
        self.paths = tuple(paths)
        self._cache = ResultCache(cache_dir)
        self.executor: Executor = executor if executor is not None else ExecExecutor()

    @property
    def cache(self) -> ResultCache:
        """The result cache this runtime reads and writes."""
        return self._cache

    def in_process(self, net: NetworkConfigList) -> bool:
        """True if every plugin of `net` runs in this process (none is exec'd)."""
        return all(self.executor.hosts(str(plugin["type"])) for plugin in net.plugins)

    def add(
        self, net: NetworkConfigList, rt: RuntimeConf, writes: list[PendingSync] | None = None
    ) -> Result:
        """ADD every plugin in order, chaining results; cache and return the final one.

        With `writes`, the cache file is written off the calling thread and its
        PendingSync appended there: the caller waits for it (or syncs after it) before it
        relies on the file.
        """
        result: Result | None = None
        for plugin in net.plugins:
            prev = result.to_dict(net.cni_version) if result is not None else None
            out = self._call("ADD", net, plugin, rt, prev)
            result = _parse_result(out, net, plugin)
        if result is None:
            raise CNIError(ErrorCode.INVALID_CONFIG, f"network {net.name!r} has no plugins")
        entry = CacheEntry(
            container_id=rt.container_id,
            config=net.raw,
            ifname=rt.ifname,
            network_name=net.name,
            netns=rt.netns,
            cni_args=list(rt.args),
            capability_args=dict(rt.capability_args),
            result=result.to_dict(net.cni_version),
        )
        if writes is None:
            self._cache.save(entry)
        else:
            writes.append(self._cache.start_save(entry))
        return result

    def check(self, net: NetworkConfigList, rt: RuntimeConf) -> None:
        """CHECK every plugin against the cached ADD result (needs cniVersion >= 0.4.0)."""
        if not version_at_least(net.cni_version, "0.4.0"):
            raise CNIError(
                ErrorCode.INCOMPATIBLE_VERSION,
                f'configuration version "{net.cni_version}" does not support the CHECK command',
                "CHECK needs cniVersion 0.4.0 or later",
            )
        if net.disable_check:
            return
        cached = self.cached_result(net.name, rt)
        if cached is None:
            raise CNIError(
                ErrorCode.UNKNOWN_CONTAINER,
                f"no cached ADD result for network {net.name!r}, container "
                f"{rt.container_id!r}, interface {rt.ifname!r}",
                "CHECK only works for attachments this runtime added; run ADD first",
            )
        prev = cached.to_dict(net.cni_version)
        for plugin in net.plugins:
            self._call("CHECK", net, plugin, rt, prev)

    def delete(self, net: NetworkConfigList, rt: RuntimeConf) -> None:
        """DEL every plugin in reverse order, then drop the cache entry."""
        prev = None
        if version_at_least(net.cni_version, "0.4.0"):
            try:
                cached = self.cached_result(net.name, rt)
            except CNIError as err:
                # An unusable entry must not block cleanup: DEL without prevResult (libcni).
                _call_log("DEL", rt).warning(
                    "ignoring cached result", network=net.name, error=str(err)
                )
                cached = None
            prev = cached.to_dict(net.cni_version) if cached is not None else None
        for plugin in reversed(net.plugins):
            self._call("DEL", net, plugin, rt, prev)
        self._cache.delete(net.name, rt.container_id, rt.ifname)

    def status(self, net: NetworkConfigList) -> None:
        """STATUS every plugin; a no-op below cniVersion 1.1.0, like libcni."""
        if not version_at_least(net.cni_version, STATUS_VERSION):
            return
        for plugin in net.plugins:
            self._call("STATUS", net, plugin, None, None)

    def gc(self, net: NetworkConfigList, valid: Sequence[tuple[str, str]]) -> None:
        """libcni's GCNetworkList: DEL stale cached attachments, then GC every plugin.

        `valid` holds (containerID, ifname) pairs. Nothing happens when the list sets
        disableGC. Errors are collected and raised together at the end.
        """
        if net.disable_gc:
            return
        keep = set(valid)
        errors: list[CNIError] = []
        for entry in self._cache.entries(net.name):
            if (entry.container_id, entry.ifname) in keep:
                continue
            rt = RuntimeConf(
                container_id=entry.container_id,
                netns=entry.netns,
                ifname=entry.ifname,
                args=tuple(entry.cni_args),
                capability_args=entry.capability_args,
            )
            try:
                self.delete(net, rt)
            except CNIError as err:
                errors.append(
                    CNIError(
                        err.code,
                        f"failed to delete stale attachment {rt.container_id} {rt.ifname}",
                        str(err),
                    )
                )
        if version_at_least(net.cni_version, STATUS_VERSION):
            attachments = [{"containerID": cid, "ifname": ifname} for cid, ifname in valid]
            for plugin in net.plugins:
                conf = {
                    **plugin,
                    VALID_ATTACHMENTS_KEY: attachments,
                    LEGACY_ATTACHMENTS_KEY: attachments,
                }
                try:
                    self._call("GC", net, conf, None, None)
                except CNIError as err:
                    errors.append(err)
        if len(errors) == 1:
            raise errors[0]
        if errors:
            raise CNIError(
                errors[0].code,
                f"GC of network {net.name!r} failed {len(errors)} times",
                "; ".join(str(e) for e in errors),
            )

    def cached_result(self, net_name: str, rt: RuntimeConf) -> Result | None:
        """The cached ADD result of an attachment as stored, or None if there is none."""
        entry = self._cache.load(net_name, rt.container_id, rt.ifname)
        if entry is None or entry.result is None:
            return None
        return Result.from_dict(entry.result)

    def _call(
        self,
        command: str,
        net: NetworkConfigList,
        plugin: Mapping[str, Any],
        rt: RuntimeConf | None,
        prev: dict[str, Any] | None,
    ) -> bytes:
        """Exec one plugin; `rt` is None for STATUS/GC, which get only CNI_COMMAND/CNI_PATH."""
        plugin_type = str(plugin["type"])
        if rt is None:
            env = cni_env(command, "", "", "", (), self.paths)
            stdin = plugin_stdin(net, plugin, {}, None)
        else:
            env = cni_env(command, rt.container_id, rt.netns, rt.ifname, rt.args, self.paths)
            stdin = plugin_stdin(net, plugin, rt.capability_args, prev)
        log = _call_log(command, rt)
        try:
            with log.step(f"plugin {command.lower()}", plugin=plugin_type, network=net.name):
                return self.executor.run(plugin_type, stdin, env)
        except CNIError as err:
            raise CNIError(
                err.code,
                f'plugin "{plugin_type}" failed ({command.lower()}): {err.msg}',
                err.details,
            ) from None


def _call_log(command: str, rt: RuntimeConf | None) -> StepLogger:
    """The log of one plugin call: its verb, container and pod (from CNI_ARGS)."""
    fields = call_fields(rt.container_id, dict(rt.args)) if rt is not None else {}
    return StepLogger("cni", verb=command.lower(), **fields)


def _parse_result(out: bytes, net: NetworkConfigList, plugin: Mapping[str, Any]) -> Result:
    """A plugin's ADD output, read in its own version and converted to the list's."""
    try:
        data = jsonio.loads(out, "its output")
        if not isinstance(data, dict):
            raise CNIError(ErrorCode.DECODE_FAILURE, "it is not a JSON object")
        # A result without cniVersion is in the config's version (libcni decodes it so).
        data.setdefault("cniVersion", net.cni_version)
        return Result.from_dict(data).convert(net.cni_version)
    except CNIError as err:
        raise CNIError(
            err.code,
            f'plugin "{plugin["type"]}" printed an unusable ADD result: {err.msg}',
            err.details,
        ) from None

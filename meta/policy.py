"""What tenant input may name on the host: one place, applied before any plugin runs.

A NAD is written by a namespace admin, not by the cluster admin, yet its plugins run as
root on the node. So the host paths a NAD's config names (an IPAM's `dataDir`, a
`resolvConf`, a kubeconfig, a log file...) must lie under the roots the daemon's own
config allows (`allowedHostPaths`), inside `chrootDir`, whether the plugin then runs
in-process or is exec'd. Configs the admin wrote (the meta config's `delegates`, conf
files in `confDir`) are trusted; so are NADs in `systemNamespaces` when the admin says
so (`trustSystemNamespaces`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

from cni.errors import CNIError, ErrorCode
from cni.invoke import find_plugin, seen_from
from meta.install import is_own_executable

PLUGIN_PATH_KEYS = ("dataDir", "logFile", "log_file", "socketPath")
"""Keys of a plugin's config that name a host path (sriov and tuning `dataDir`,
sriov-cni's `logFile`, ...)."""
IPAM_PATH_KEYS = (
    "dataDir",  # host-local
    "resolvConf",  # host-local
    "daemonSocketPath",  # dhcp
    "configuration_path",  # whereabouts
    "log_file",  # whereabouts
)
"""Keys of a plugin's `ipam` section that name a host path."""
NESTED_PATH_KEYS = (("ipam", "kubernetes", "kubeconfig"),)
"""Deeper keys that name a host path (whereabouts' kubeconfig)."""

_PCI_ADDRESS = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]")
_OPAQUE_DEVICE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


class HostPathPolicy:
    """Refuses tenant configs that name host paths outside the admin's allowed roots."""

    def __init__(self, allowed: list[str], chroot_dir: str = "") -> None:
        self.root = chroot_dir.rstrip("/")
        self.allowed = [_normal(path) for path in allowed]

    def check(self, config: dict[str, Any], network: str) -> None:
        """CNIError(INVALID_CONFIG) naming the first path key of `config` (a conf or
        conflist) that is not absolute, normal and under an allowed root."""
        for key, value in path_values(config):
            if problem := self.problem(value):
                raise CNIError(
                    ErrorCode.INVALID_CONFIG,
                    f"network {network}: {key} {value!r} is refused: {problem}",
                    "a network-attachment-definition may name only host paths under the "
                    f"daemon's allowedHostPaths ({', '.join(self.allowed) or 'none'}); "
                    "ask the cluster admin to allow the path, or leave the key out for "
                    "the plugin's default",
                )

    def problem(self, value: object) -> str:
        """Why `value` may not be named by a tenant, or ""."""
        if not isinstance(value, str):
            return "it is not a string"
        if not value.startswith("/"):
            return "it is not an absolute path"
        if "\0" in value or _normal(value) != (value.rstrip("/") or "/"):
            return "it is not a normalised path (no '.', '..' or '//' in it)"
        real = os.path.realpath(self.root + value)
        if not any(_within(real, os.path.realpath(self.root + root)) for root in self.allowed):
            return "it is not under an allowed host path (symlinks are followed)"
        return ""


def path_values(config: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """(key as written in errors, value) of every host-path key set in a conf or conflist."""
    plugins = config.get("plugins")
    for plugin in plugins if isinstance(plugins, list) else [config]:
        if not isinstance(plugin, dict):
            continue
        kind = str(plugin.get("type", "?"))
        for key in PLUGIN_PATH_KEYS:
            if key in plugin:
                yield f"{kind} {key}", plugin[key]
        ipam = plugin.get("ipam")
        if isinstance(ipam, dict):
            for key in IPAM_PATH_KEYS:
                if key in ipam:
                    yield f"{kind} ipam.{key}", ipam[key]
        for path in NESTED_PATH_KEYS:
            found, value = _dig(plugin, path)
            if found:
                yield f"{kind} {'.'.join(path)}", value


def refuse_plexus(plugin_type: str, binary: str) -> None:
    """CNIError(INVALID_CONFIG) if `binary` is the Plexus meta-plugin: a network that
    delegates to it would run Plexus again with a config of the NAD's choosing."""
    if is_own_executable(binary):
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            f'plugin "{plugin_type}" is Plexus itself ({binary}): a network may not '
            "delegate to the meta-plugin",
            "name the network's own plugin (bridge, macvlan, ...) as its type",
        )


def refuse_plexus_delegates(
    configs: list[dict[str, Any]], paths: list[str], root: str = ""
) -> None:
    """refuse_plexus for every plugin and IPAM type of these confs or conflists that is a
    file in `paths` (seen from `root`), before any of them runs."""
    for config in configs:
        plugins = config.get("plugins")
        for plugin in plugins if isinstance(plugins, list) else [config]:
            if not isinstance(plugin, dict):
                continue
            ipam = plugin.get("ipam")
            for kind in (plugin.get("type"), ipam.get("type") if isinstance(ipam, dict) else None):
                if not isinstance(kind, str) or not kind or "/" in kind:
                    continue  # the exec, if any, reports it
                try:
                    binary = find_plugin(kind, paths, root)
                except CNIError:
                    continue
                refuse_plexus(kind, seen_from(root, binary) if root else binary)


def device_id_problem(device_id: str) -> str:
    """Why `device_id` is neither a PCI address nor an opaque ID free of path characters."""
    if _PCI_ADDRESS.fullmatch(device_id) or (
        _OPAQUE_DEVICE_ID.fullmatch(device_id) and ".." not in device_id
    ):
        return ""
    return (
        f'deviceID "{device_id}" is neither a PCI address (0000:3b:02.1) nor an ID of '
        "letters, digits, '_', '.', ':' and '-' (at most 128, no '..')"
    )


def _dig(data: dict[str, Any], path: tuple[str, ...]) -> tuple[bool, Any]:
    value: Any = data
    for key in path:
        if not isinstance(value, dict) or key not in value:
            return False, None
        value = value[key]
    return True, value


def _normal(path: str) -> str:
    return os.path.normpath(path).replace("//", "/")


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")

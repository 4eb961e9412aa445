"""Network configurations: loading a conf or conflist, and building each plugin's stdin."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cni import jsonio
from cni.errors import CNIError, ErrorCode
from cni.version import select_version

_NETWORK_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.\-]*")
NETWORK_NAME_RULE = "letters, digits, '_', '.' and '-', starting with a letter or digit"

# Go's strconv.ParseBool, which libcni uses for string-valued flags.
_BOOL_STRINGS = {
    **dict.fromkeys(("1", "t", "T", "TRUE", "true", "True"), True),
    **dict.fromkeys(("0", "f", "F", "FALSE", "false", "False"), False),
}


@dataclass
class NetworkConfigList:
    """A conflist (a single conf is wrapped as a one-plugin list, like libcni)."""

    name: str
    cni_version: str
    plugins: list[dict[str, Any]]
    disable_check: bool
    disable_gc: bool
    raw: bytes
    is_list: bool


def load_network_config(data: bytes) -> NetworkConfigList:
    """Parse a conf or conflist (a conflist is an object with "plugins").

    CNIError(DECODE_FAILURE) if it is not a JSON object, CNIError(INVALID_CONFIG) for a
    missing name/type or bad field, CNIError(INCOMPATIBLE_VERSION) for unsupported versions.
    """
    conf = jsonio.loads(data, "network configuration")
    if not isinstance(conf, dict):
        raise CNIError(ErrorCode.DECODE_FAILURE, "network configuration must be a JSON object")
    if "plugins" not in conf:
        _check_plugin(conf, "network configuration")
        return NetworkConfigList(
            name=_name(conf),
            cni_version=select_version(conf),
            plugins=[conf],
            disable_check=False,
            disable_gc=False,
            raw=data,
            is_list=False,
        )
    name = _name(conf)
    plugins = conf["plugins"]
    if not isinstance(plugins, list) or not plugins:
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            f"network configuration list {name!r} has no plugins",
            "'plugins' must be a non-empty list of plugin objects",
        )
    for index, plugin in enumerate(plugins):
        _check_plugin(plugin, f"plugin {index} of network {name!r}")
    return NetworkConfigList(
        name=name,
        cni_version=select_version(conf),
        plugins=plugins,
        disable_check=_flag(conf, "disableCheck"),
        disable_gc=_flag(conf, "disableGC"),
        raw=data,
        is_list=True,
    )


def _name(conf: Mapping[str, Any]) -> str:
    name = conf.get("name")
    if not isinstance(name, str) or not name:
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            "network configuration has no 'name'",
            "set 'name' to a non-empty string",
        )
    if not valid_network_name(name):
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            f"invalid characters found in network name {name!r}",
            f"a network name is {NETWORK_NAME_RULE}",
        )
    return name


def valid_network_name(name: str) -> bool:
    """The CNI spec's rule for network names (libcni's ValidateNetworkName).

    Plugins and IPAM build paths from the name (host-local's `<dataDir>/<name>`, the
    result cache), so this also keeps `..` and `/` out of them.
    """
    return _NETWORK_NAME.fullmatch(name) is not None


def _check_plugin(plugin: Any, what: str) -> None:
    if not isinstance(plugin, dict):
        raise CNIError(ErrorCode.INVALID_CONFIG, f"{what} must be a JSON object")
    plugin_type = plugin.get("type")
    if not isinstance(plugin_type, str) or not plugin_type:
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            f"{what} has no 'type'",
            "set 'type' to the plugin binary's name, or give a 'plugins' list",
        )
    if "/" in plugin_type:
        raise CNIError(
            ErrorCode.INVALID_CONFIG,
            f"{what} has invalid type {plugin_type!r}",
            "'type' is a binary name looked up in CNI_PATH and must not contain '/'",
        )


def _flag(conf: Mapping[str, Any], key: str) -> bool:
    value = conf.get(key, False)
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value in _BOOL_STRINGS:
        return _BOOL_STRINGS[value]
    raise CNIError(ErrorCode.INVALID_CONFIG, f"{key!r} must be true or false, got {value!r}")


CHAINED_SUFFIX = ".conf"
"""Plugin confs chained from `<dir>/<network name>/` end so (libcni 1.3)."""
CONFLIST_SUFFIX = ".conflist"
"""Only a conflist read from a file gets the plugins of its network's subdirectory:
runtimes read `.conf` and `.json` files as single plugins (go-cni, Multus)."""


def with_chained_plugins(conf: dict[str, Any], path: Path) -> dict[str, Any]:
    """`conf`, read from the file at `path`, as libcni 1.3 loads it: a `.conflist` without
    `loadOnlyInlinedPlugins` gets the plugins of its network's subdirectory appended (see
    `chained_plugins`); any other file is returned as is.

    CNIError(INVALID_CONFIG) for a bad name, `plugins` or `loadOnlyInlinedPlugins`, or a
    chained file that is not a plugin conf.
    """
    if not path.name.endswith(CONFLIST_SUFFIX) or _flag(conf, "loadOnlyInlinedPlugins"):
        return conf
    chained = chained_plugins(path.parent, _name(conf))
    if not chained:
        return conf
    inline = conf.get("plugins", [])  # libcni allows a conflist whose plugins are all chained
    if not isinstance(inline, list):
        raise CNIError(ErrorCode.INVALID_CONFIG, f"config file {path}: 'plugins' must be a list")
    return {**conf, "plugins": [*inline, *chained]}


def chained_plugins(conf_dir: Path, network: str) -> list[dict[str, Any]]:
    """The plugins libcni 1.3 appends to a network loaded from a conflist in `conf_dir`
    (containernetworking/cni#1052): every `*.conf` file in `<conf_dir>/<network>/`, in
    file-name order, subdirectories skipped; none if that directory does not exist.

    CNIError(INVALID_CONFIG) for a `network` that is not a network name (it becomes a
    path), or naming a file that is not a plugin conf (libcni then fails the whole
    network too).
    """
    _name({"name": network})
    directory = conf_dir / network
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise CNIError(
            ErrorCode.IO_FAILURE, f"cannot list chained plugins in {directory}", str(exc)
        ) from exc
    plugins = []
    for name in names:
        path = directory / name
        if not name.endswith(CHAINED_SUFFIX) or path.is_dir():
            continue
        try:
            plugin = jsonio.loads(path.read_bytes(), f"chained plugin {path}")
        except OSError as exc:
            raise CNIError(ErrorCode.IO_FAILURE, f"cannot read {path}", str(exc)) from exc
        _check_plugin(plugin, f"chained plugin {path}")
        plugins.append(plugin)
    return plugins


def plugin_stdin(
    net: NetworkConfigList,
    plugin: Mapping[str, Any],
    runtime_config: Mapping[str, Any],
    prev_result: dict[str, Any] | None,
) -> bytes:
    """The config one plugin of `net` reads on stdin.

    Injects the list's `name` and `cniVersion`, a `runtimeConfig` holding only the
    capabilities the plugin declares true (omitted if none apply) and `prevResult`.
    """
    conf = dict(plugin)
    conf["name"] = net.name
    conf["cniVersion"] = net.cni_version
    capabilities = plugin.get("capabilities")
    if isinstance(capabilities, Mapping):
        wanted = {k: v for k, v in runtime_config.items() if capabilities.get(k) is True}
        if wanted:
            conf["runtimeConfig"] = wanted
    if prev_result is not None:
        conf["prevResult"] = prev_result
    return json.dumps(conf, separators=(",", ":")).encode()

"""CNI config generation, as Multus does it: wrap the node's primary network.

The primary is the first config (sorted) in the host's net.d that is not ours, with the
plugins libcni 1.3 chains onto it from `<net.d>/<its name>/`; the plugins of
`<net.d>/plexus-cni-network/` are inlined after ours (see `build`).
Ours is written last of all, since its presence tells the runtime the node's
network is ready; it is re-generated when the primary changes. It stays when the daemon
stops: removing it on exit (as Multus does, multus-cni #1527) lets pods created during a
restart or upgrade start on the primary network alone. Only `plexus uninstall-cni`
removes it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

from cni import jsonio
from cni.config import chained_plugins, with_chained_plugins
from cni.errors import CNIError, ErrorCode
from cni.fileio import write_atomic
from cni.version import STATUS_VERSION, is_supported, version_at_least
from meta.attachments import CONF_SUFFIXES
from meta.daemon.config import DAEMON_ONLY_KEYS, NETWORK_NAME, DaemonConfig

log = logging.getLogger("plexus.daemon")

# Keys of the daemon's config that mean nothing to the per-call engine (the shim reads
# socketDir from each call's config).
_DAEMON_ONLY = DAEMON_ONLY_KEYS - {"socketDir"}
_OWN_KEYS = {"cniVersion", "name", "type", "delegates", "capabilities", "runtimeConfig"}


def find_primary(net_dir: Path, own_name: str) -> Path | None:
    """The first .conf/.conflist/.json in `net_dir` that is not ours."""
    try:
        names = sorted(os.listdir(net_dir))
    except FileNotFoundError:
        return None
    for name in names:
        if name != own_name and not name.startswith(".") and name.endswith(CONF_SUFFIXES):
            return net_dir / name
    return None


def build(
    primary: dict[str, Any], conf: DaemonConfig, chained: list[dict[str, Any]]
) -> dict[str, Any]:
    """Our conflist: one `plexus` plugin delegating to the primary, capabilities united,
    then the `chained` plugins of our own network's directory.

    Its cniVersion is the primary's: the runtime is known to accept that one (a newer
    one of our own may be more than its libcni reads), and Plexus speaks every version.
    Below 1.1.0, `cniVersions` adds 1.1.0: libcni 1.3 (containerd 2.x) picks the highest
    it knows, so it calls STATUS and the daemon's readiness is the node's NetworkReady;
    older libcni reads `cniVersion` only. Not with chained plugins of our own: they run at
    the list's version, and only the primary's is known to suit the node's plugins.
    The chain is inlined and `loadOnlyInlinedPlugins` set, so every runtime runs the same
    one: libcni before 1.3 (containerd 1.6) never reads `<net.d>/plexus-cni-network/`, and
    containerd 2.x reloads only when a file in net.d changes, not when that directory does.
    """
    plugins = primary.get("plugins", [primary])
    capabilities = sorted(
        {cap for p in plugins for cap, on in (p.get("capabilities") or {}).items() if on is True}
    )
    version = str(primary.get("cniVersion", "0.1.0"))
    settings = {
        key: value
        for key, value in conf.model_dump(by_alias=True, exclude_defaults=True).items()
        if key not in _DAEMON_ONLY | _OWN_KEYS
    }
    settings["socketDir"] = conf.socket_dir
    plugin: dict[str, Any] = {"type": "plexus", **settings, "delegates": [primary]}
    if capabilities:
        plugin["capabilities"] = dict.fromkeys(capabilities, True)
    conflist: dict[str, Any] = {"cniVersion": version}
    if not chained and is_supported(version) and not version_at_least(version, STATUS_VERSION):
        conflist["cniVersions"] = [version, STATUS_VERSION]
    return conflist | {
        "name": NETWORK_NAME,
        "loadOnlyInlinedPlugins": True,
        "plugins": [plugin, *chained],
    }


def read_primary(path: Path) -> dict[str, Any]:
    """The primary network's config as a libcni 1.3 runtime would run it: a conflist
    with the plugins of `<net.d>/<its name>/*.conf` chained after its own. Ours then
    runs that whole chain, since the runtime no longer reads the primary's file."""
    primary = jsonio.loads(path.read_bytes(), str(path))
    if not isinstance(primary, dict):
        raise CNIError(ErrorCode.INVALID_CONFIG, f"{path} must be a JSON object")
    return with_chained_plugins(primary, path)


class ConfigWriter:
    """Keeps `<cniConfigDir>/00-plexus.conflist` in step with the primary network."""

    def __init__(self, conf: DaemonConfig, interval: float = 1.0) -> None:
        self.conf = conf
        self.net_dir = Path(conf.cni_conf_dir)
        self.target = self.net_dir / conf.generated_name
        self.interval = interval
        self._authority: tuple[tuple[int, int, int], DaemonConfig] | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cni-config", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop watching; our config stays, so the runtime keeps sending pods to the shim."""
        self._stop.set()
        self._thread.join()

    def sync(self) -> bool:
        """Write our config if the primary exists and changed; True when ours is in place."""
        indicator = self.conf.readiness_indicator_file
        if indicator and not os.path.exists(indicator):
            return False
        primary_path = find_primary(self.net_dir, self.conf.generated_name)
        if primary_path is None:
            return False
        try:
            primary = read_primary(primary_path)
            chained = chained_plugins(self.net_dir, NETWORK_NAME)
        except (OSError, CNIError) as exc:
            log.warning(
                "cannot read the primary CNI config or a chained plugin (our config, if "
                "any, stays as it was)",
                extra={"file": str(primary_path), "error": str(exc)},
            )
            return False
        text = json.dumps(build(primary, self.conf, chained), indent=2).encode()
        if _read(self.target) != text:  # a restarted daemon leaves an unchanged one alone
            write_atomic(self.target, text, 0o644)
            log.info(
                "wrote CNI config", extra={"file": str(self.target), "primary": str(primary_path)}
            )
        return True

    def authority(self) -> DaemonConfig:
        """The daemon's config with the primary our conflist on disk wraps as its
        delegates: what a call from the runtime must match (meta/authority.py). Read
        again only when the file changes."""
        try:
            st = os.stat(self.target)
        except OSError:
            return self.conf
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        kept = self._authority
        if kept is not None and kept[0] == key:
            return kept[1]
        conf = self.conf
        try:
            plugin = jsonio.loads(self.target.read_bytes(), str(self.target))["plugins"][0]
            delegates = plugin["delegates"]
            if isinstance(delegates, list) and all(isinstance(d, dict) for d in delegates):
                conf = self.conf.model_copy(update={"delegates": delegates})
        except (OSError, CNIError, LookupError, TypeError) as exc:
            log.warning(
                "cannot read our CNI config: calls must match the daemon's config alone",
                extra={"file": str(self.target), "error": str(exc)},
            )
        self._authority = (key, conf)
        return conf

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sync()
            self._stop.wait(self.interval)


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None

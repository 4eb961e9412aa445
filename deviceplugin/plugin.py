"""The device plugin process: discover, serve one gRPC server per resource, register,
then follow the kernel's events and the kubelet's restarts until stopped.

Registration is either `kubelet` (legacy: sockets in the device-plugins dir and
`Register` on kubelet.sock; when the kubelet restarts it wipes that dir, so a vanished
socket or a new kubelet.sock means serve again and re-register) or `watcher` (sockets
in the plugins_registry dir, found by the kubelet's plugin watcher). Resources the DRA
kubelet plugin serves (deviceplugin/dra) get no device plugin server: their pools go to
it instead, so no VF can be handed out both ways. `set_config` swaps the resource list
while serving (SR-IOV provisioning feeds it from policies): new resources get a server and
register, dropped ones stop, the rest keep their streams and only see their pools change.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from deviceplugin.config import DevicePluginConfig
from deviceplugin.dra.plugin import DraPlugin
from deviceplugin.monitor import ChangeMonitor
from deviceplugin.registration import RegistrationError, register
from deviceplugin.selectors import build_pools, healthy
from deviceplugin.server import HostPaths, ResourceServer
from deviceplugin.sysfs import PciNetDevice, default_route_ifaces, discover

DEVICE_PLUGINS_DIR = "/var/lib/kubelet/device-plugins"
PLUGINS_REGISTRY_DIR = "/var/lib/kubelet/plugins_registry"
SETTLE_SECONDS = 0.05  # events come in bursts (a VF brings pci + net + link events)
CHECK_SECONDS = 1.0  # kubelet restart checks, and the longest a wake-up waits

log = logging.getLogger("plexus.deviceplugin")

Mode = Literal["kubelet", "watcher"]


@dataclass(frozen=True)
class PluginOptions:
    paths: HostPaths = field(default_factory=HostPaths)
    plugins_dir: Path = Path(DEVICE_PLUGINS_DIR)
    registry_dir: Path = Path(PLUGINS_REGISTRY_DIR)
    mode: Mode = "kubelet"
    resync_seconds: float = 30.0  # a full rescan even without events


def socket_name(resource: str) -> str:
    """`intel.com/igb_vf` -> `plexus-intel.com_igb_vf.sock`."""
    return "plexus-" + resource.replace("/", "_") + ".sock"


def _inode(path: Path) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


class DevicePluginRunner:
    """Owns the resource servers; `run` serves until `stop` is called."""

    def __init__(
        self, config: DevicePluginConfig, options: PluginOptions, dra: DraPlugin | None = None
    ) -> None:
        self.config = config
        self.options = options
        self.dra = dra
        self.dra_resources: list[str] = []
        self.servers: list[ResourceServer] = []
        self.on_scan: list[Callable[[list[PciNetDevice]], None]] = []  # after each scan
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._kubelet_inode: int | None = None
        self._unregistered: set[str] = set()
        self._serving = False
        self._lock = threading.Lock()
        self._pending: DevicePluginConfig | None = None
        self._configure(config)

    def set_config(self, config: DevicePluginConfig) -> None:
        """Serve `config`'s resources from the next scan on (safe from any thread)."""
        with self._lock:
            self._pending = config
        self._wake.set()

    def _configure(self, config: DevicePluginConfig) -> None:
        """Match the servers to `config` (on the thread that runs them)."""
        self.config = config
        dra = self.dra
        self.dra_resources = [
            r.full_name for r in config.resource_list if dra and dra.options.serves(r.full_name)
        ]
        wanted = {
            r.full_name: r for r in config.resource_list if r.full_name not in self.dra_resources
        }
        kept = []
        for server in self.servers:
            if server.name in wanted:
                server.resource = wanted.pop(server.name)
                kept.append(server)
            else:
                server.close()
                self._unregistered.discard(server.name)
        opts = self.options
        sock_dir = opts.plugins_dir if opts.mode == "kubelet" else opts.registry_dir
        for name, res in wanted.items():
            server = ResourceServer(res, sock_dir / socket_name(name), opts.paths)
            if self._serving:
                server.start(serve_registration=opts.mode == "watcher")
            kept.append(server)
            self._unregistered.add(name)
        self.servers = kept

    def _take_pending(self) -> None:
        with self._lock:
            config, self._pending = self._pending, None
        if config is not None:
            self._configure(config)

    def scan(self) -> None:
        """Re-read sysfs and push every resource's pool and health to its server."""
        devices = discover(self.options.paths.sysfs_root, default_route_ifaces())
        by_address = {d.address: d for d in devices}
        pools = build_pools(self.config, devices)
        health = {d.address: healthy(d, by_address) for d in devices}
        for server in self.servers:
            pool = {d.address: d for d in pools[server.name]}
            server.update(pool, {a: health[a] for a in pool})
        if self.dra is not None:
            self.dra.update({r: pools[r] for r in self.dra_resources}, health)
        for listener in self.on_scan:
            listener(devices)

    def wake(self) -> None:
        """Rescan soon (the monitor calls this on kernel events)."""
        self._wake.set()

    def stop(self) -> None:
        """Make `run` return (safe from signal handlers and other threads)."""
        self._stop.set()
        self._wake.set()

    def run(self) -> None:
        """Serve, register and follow changes until `stop`; then stop the servers."""
        started = time.monotonic()
        self._take_pending()
        self.scan()
        log.info("discovery took %.1f ms", (time.monotonic() - started) * 1000)
        watcher = self.options.mode == "watcher"
        monitor: ChangeMonitor | None = None
        try:
            self._serving = True
            for server in self.servers:
                server.start(serve_registration=watcher)
            if self.dra is not None:
                self.dra.start()
            monitor = ChangeMonitor(self.wake)
            monitor.start()
            last_scan = time.monotonic()
            while not self._stop.is_set():
                if not watcher:
                    self._keep_registered()
                if self._wake.wait(CHECK_SECONDS):
                    if self._stop.wait(SETTLE_SECONDS):
                        break
                    self._wake.clear()
                elif time.monotonic() - last_scan < self.options.resync_seconds:
                    continue
                self._take_pending()
                self.scan()
                last_scan = time.monotonic()
        finally:
            if monitor is not None:
                monitor.stop()
            if self.dra is not None:
                self.dra.stop()
            for server in self.servers:
                server.close()

    def _keep_registered(self) -> None:
        """Legacy mode: re-serve and re-register after a kubelet restart."""
        kubelet = self.options.plugins_dir / "kubelet.sock"
        inode = _inode(kubelet)
        if inode is None:
            return  # no kubelet (yet); try again on the next check
        if inode != self._kubelet_inode:
            self._kubelet_inode = inode
            self._unregistered = {s.name for s in self.servers}
        for server in self.servers:
            if not server.socket_path.exists():
                log.warning(
                    "resource %s: socket gone (kubelet restart?): serving again", server.name
                )
                server.stop()
                server.start()
                self._unregistered.add(server.name)
            if server.name in self._unregistered:
                try:
                    register(self.options.plugins_dir, server.socket_path.name, server.name)
                except RegistrationError as exc:
                    log.error("%s", exc)
                    continue
                log.info("resource %s: registered with the kubelet", server.name)
                self._unregistered.discard(server.name)

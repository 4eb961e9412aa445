"""Wake the device plugin when devices may have changed.

Two kernel event sources, no polling: uevents (pyudev, straight from the kernel, so no
udevd is needed) for PCI functions and netdevs appearing, vanishing or changing driver
(VFs created or removed through `sriov_numvfs`, driver bind/unbind, renames), and
rtnetlink link notifications for link state (a PF or VF going down or up). Any event
only calls `trigger`; the plugin then re-reads sysfs.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
from collections.abc import Callable

import pyudev

RTMGRP_LINK = 0x1
UEVENT_SUBSYSTEMS = frozenset({"pci", "net"})

log = logging.getLogger("plexus.deviceplugin")


class ChangeMonitor:
    """A thread that calls `trigger` on every relevant kernel event until `stop`."""

    def __init__(self, trigger: Callable[[], None]) -> None:
        self.trigger = trigger
        self._uevents = pyudev.Monitor.from_netlink(pyudev.Context(), source="kernel")
        self._rtnl = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self._rtnl.bind((0, RTMGRP_LINK))
        self._rtnl.setblocking(False)
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="dp-monitor", daemon=True)

    def start(self) -> None:
        self._uevents.start()
        self._thread.start()

    def stop(self) -> None:
        os.write(self._wake_w, b"x")
        self._thread.join()
        self._rtnl.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        uevent_fd = self._uevents.fileno()
        while True:
            ready, _, _ = select.select([uevent_fd, self._rtnl, self._wake_r], [], [])
            if self._wake_r in ready:
                return
            changed = False
            if self._rtnl in ready:
                changed |= self._drain_rtnl()
            if uevent_fd in ready:
                changed |= self._drain_uevents()
            if changed:
                self.trigger()

    def _drain_rtnl(self) -> bool:
        got = False
        while True:
            try:
                got |= bool(self._rtnl.recv(65536))
            except BlockingIOError:
                return got
            except OSError as exc:  # ENOBUFS: events were lost; a rescan covers them
                log.warning("rtnetlink monitor: %s", exc)
                return True

    def _drain_uevents(self) -> bool:
        got = False
        while (device := self._uevents.poll(timeout=0)) is not None:
            got |= device.subsystem in UEVENT_SUBSYSTEMS
        return got

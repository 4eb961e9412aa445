"""Binding a VF to a kernel driver through sysfs, the way `driverctl` does.

`driver_override` names the driver the PCI core may bind (empty: any, so the VF's own
kernel driver, "netdevice", comes back); the current driver lets go through its `unbind`
file, and `drivers_probe` has the PCI core bind it again. Every write is below a sysfs
root, so tests can point it at a fake tree.
"""

from __future__ import annotations

import os
from pathlib import Path

from deviceplugin.allocate import UIO_DRIVERS, VFIO_DRIVERS

NETDEVICE = "netdevice"
USERSPACE_DRIVERS = VFIO_DRIVERS | UIO_DRIVERS


class BindError(OSError):
    """A sysfs write refused; the message names the device, driver and file."""


def current_driver(sysfs_root: Path, address: str) -> str:
    try:
        return os.path.basename(os.readlink(_device(sysfs_root, address) / "driver"))
    except OSError:
        return ""


def _device(sysfs_root: Path, address: str) -> Path:
    return sysfs_root / "bus" / "pci" / "devices" / address


def _write(path: Path, value: str, what: str) -> None:
    try:
        with path.open("w") as f:
            f.write(value)
    except OSError as exc:
        raise BindError(exc.errno, f"{what}: writing {path}: {exc.strerror}") from None


def bind(sysfs_root: Path, address: str, driver: str, native: str = "") -> None:
    """Bind `address` to `driver` (`netdevice`: the driver the kernel picks, or `native`
    when that is known); nothing happens if it already has that driver."""
    now = current_driver(sysfs_root, address)
    if driver == NETDEVICE:
        if now and (now == native or (not native and now not in USERSPACE_DRIVERS)):
            return
    elif now == driver:
        return
    what = f"binding {address} to {driver}"
    dev = _device(sysfs_root, address)
    _write(dev / "driver_override", "\n" if driver == NETDEVICE else driver, what)
    if now:
        _write(dev / "driver" / "unbind", address, what)
    _write(sysfs_root / "bus" / "pci" / "drivers_probe", address, what)

"""Binding a VF to a kernel driver through sysfs, the way `driverctl` does.

`driver_override` names the driver the PCI core may bind (empty: any, so the VF's own
kernel driver, "netdevice", comes back); the current driver lets go through its `unbind`
file, and `drivers_probe` has the PCI core bind it again. Every write is below a sysfs
root, so tests can point it at a fake tree.
"""

from __future__ import annotations

from pathlib import Path

from deviceplugin.sysfs import USERSPACE_DRIVERS, device_dir, driver_of

NETDEVICE = "netdevice"


class BindError(OSError):
    """A sysfs write refused; the message names the device, driver and file."""


def _write(path: Path, value: str, what: str) -> None:
    try:
        with path.open("w") as f:
            f.write(value)
    except OSError as exc:
        raise BindError(exc.errno, f"{what}: writing {path}: {exc.strerror}") from None


def bind(sysfs_root: Path, address: str, driver: str, native: str = "") -> None:
    """Bind `address` to `driver` (`netdevice`: the driver the kernel picks, or `native`
    when that is known); nothing happens if it already has that driver."""
    now = driver_of(address, sysfs_root)
    if driver == NETDEVICE:
        if now and (now == native or (not native and now not in USERSPACE_DRIVERS)):
            return
    elif now == driver:
        return
    what = f"binding {address} to {driver}"
    dev = device_dir(address, sysfs_root)
    _write(dev / "driver_override", "\n" if driver == NETDEVICE else driver, what)
    if now:
        _write(dev / "driver" / "unbind", address, what)
    _write(sysfs_root / "bus" / "pci" / "drivers_probe", address, what)

"""Every write provisioning makes to the host, through sysfs below one root.

`sriov_numvfs` creates and removes VFs (the kernel takes a new count only from 0); a VF's
driver changes through `driver_override` and `drivers_probe` (deviceplugin/dra/bind.py);
MTU and the admin state are a netdev's `mtu` and `flags` files, so no netlink is needed.
What only a reboot can fix (no IOMMU for vfio-pci, no room for VFs without `pci=realloc`)
is a `HostError` with `reboot` set: it is reported, never retried in a loop, and Plexus
never edits the bootloader.
"""

from __future__ import annotations

import errno
import os
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from deviceplugin.dra.bind import BindError, bind
from deviceplugin.provision.crs import VFIO_PCI

IFF_UP = 0x1
IOMMU_ARGS = "intel_iommu=on iommu=pt (Intel) or iommu=pt (AMD)"
NOIOMMU = "module/vfio/parameters/enable_unsafe_noiommu_mode"
MODULES = {VFIO_PCI: "vfio-pci"}  # drivers provisioning may load, and their modules


class HostError(OSError):
    """A write the host refused; `reboot` names the kernel arguments that would fix it."""

    def __init__(self, message: str, reboot: str = "") -> None:
        super().__init__(message)
        self.reboot = reboot


class Host:
    """The sysfs writes of provisioning, below `root` (tests point it at a fake tree)."""

    def __init__(
        self,
        root: Path = Path("/sys"),
        modprobe: Sequence[str] = ("modprobe",),
        settle_seconds: float = 30.0,
    ) -> None:
        self.root = root
        self.modprobe = tuple(modprobe)
        self.settle_seconds = settle_seconds

    def device(self, address: str) -> Path:
        return self.root / "bus" / "pci" / "devices" / address

    def _write(self, path: Path, value: str, what: str) -> None:
        try:
            with path.open("w") as f:
                f.write(value)
        except OSError as exc:
            reboot = ""
            if exc.errno == errno.ENOMEM and path.name == "sriov_numvfs":
                reboot = "pci=realloc"  # the BIOS left no bus room for the VFs
            raise HostError(
                f"{what}: writing {value.strip()!r} to {path}: {exc.strerror}", reboot
            ) from None

    def set_num_vfs(self, pf: str, count: int) -> None:
        """Make `pf` have `count` VFs (through 0 if it has others) and wait for them."""
        numvfs = self.device(pf) / "sriov_numvfs"
        what = f"setting {count} VFs on {pf}"
        try:
            current = int(numvfs.read_text())
        except (OSError, ValueError) as exc:
            raise HostError(f"{what}: cannot read {numvfs}: {exc}") from None
        if current == count:
            return
        if current:
            self._write(numvfs, "0", what)
        if count:
            self._write(numvfs, str(count), what)
        self._wait_vfs(pf, count)

    def _wait_vfs(self, pf: str, count: int) -> None:
        """Until each VF has its `virtfnN` link and a driver (autoprobe binds one)."""
        deadline = time.monotonic() + self.settle_seconds
        links = [self.device(pf) / f"virtfn{i}" for i in range(count)]
        while True:
            missing = [p.name for p in links if not (p / "driver").exists()]
            if not missing:
                return
            if time.monotonic() > deadline:
                if all(p.exists() for p in links):
                    return  # created; no driver took them (autoprobe off): binding follows
                raise HostError(f"VFs {', '.join(missing)} of {pf} did not appear")
            time.sleep(0.05)

    def bind(self, vf: str, driver: str) -> None:
        """Bind `vf` to `driver` ("netdevice": its own kernel driver); loads vfio-pci first."""
        if driver in MODULES:
            self._ready_for(vf, driver)
        try:
            bind(self.root, vf, driver)
        except BindError as exc:
            raise HostError(str(exc)) from None

    def _ready_for(self, vf: str, driver: str) -> None:
        if not (self.root / "bus" / "pci" / "drivers" / driver).is_dir():
            argv = [*self.modprobe, MODULES[driver]]
            try:
                done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise HostError(f"loading {driver} for {vf}: {' '.join(argv)}: {exc}") from None
            if done.returncode != 0:
                raise HostError(f"loading {driver} for {vf}: {done.stderr.strip()}")
        if driver == VFIO_PCI and not self.iommu(vf):
            raise HostError(
                f"binding {vf} to vfio-pci needs an IOMMU, and it has no IOMMU group: boot "
                f"with {IOMMU_ARGS} (and enable VT-d/AMD-Vi in the firmware)",
                reboot=IOMMU_ARGS,
            )

    def iommu(self, vf: str) -> bool:
        """Whether vfio-pci can take `vf`: it has an IOMMU group, or no-IOMMU mode is on."""
        if (self.device(vf) / "iommu_group").exists():
            return True
        try:
            return (self.root / NOIOMMU).read_text().strip() in ("Y", "1")
        except OSError:
            return False

    def set_mtu(self, pci: str, netdev: str, mtu: int) -> None:
        self._write(self._net(pci, netdev) / "mtu", str(mtu), f"setting MTU {mtu} on {netdev}")

    def set_up(self, pci: str, netdev: str) -> None:
        flags = self._net(pci, netdev) / "flags"
        try:
            value = int(flags.read_text(), 16)
        except (OSError, ValueError) as exc:
            raise HostError(f"setting {netdev} up: cannot read {flags}: {exc}") from None
        self._write(flags, hex(value | IFF_UP), f"setting {netdev} up")

    def _net(self, pci: str, netdev: str) -> Path:
        """The netdev's sysfs dir; under its new name if udev renamed it meanwhile."""
        if not netdev or os.sep in netdev or netdev in (".", ".."):
            raise HostError(f"{pci}: no netdev to configure")
        net = self.device(pci) / "net"
        if not (net / netdev).exists():
            names = os.listdir(net) if net.is_dir() else []
            if len(names) != 1:
                raise HostError(f"{pci}: netdev {netdev} is gone")
            netdev = names[0]
        return net / netdev

"""A FAKE kernel for provisioning tests where no VM runs: the host's SR-IOV writes acted out on
a FakeSysfs tree (the host kernel has no CONFIG_PCI_IOV). `sriov_numvfs` makes or removes VF
directories and links as the kernel would, a driver change moves the `driver` link (a
netdev comes with a kernel driver, goes with vfio-pci); MTU and flags are the real Host's
plain file writes. The real kernel's behaviour is tested in the VM (tests/vm/guest)."""

from __future__ import annotations

import os
import shutil

from deviceplugin.dra.bind import NETDEVICE
from deviceplugin.provision.host import Host
from tests.unit.deviceplugin.fake_sysfs import FakeSysfs

VF_DRIVER = "igbvf"


def vf_address(pf: str, index: int) -> str:
    """`0000:3b:00.1`, 2 -> `0000:3b:06.2` (as igb numbers them: a slot per 8 VFs)."""
    slot = 2 + 4 * int(pf[-1]) + index // 8
    return f"{pf[:8]}{slot:02x}.{index % 8}"


def vf_mac(index: int) -> str:
    return f"52:54:00:12:35:{index:02x}"


class FakeKernel(Host):
    """FAKE host writes on `sysfs`; `writes` logs each one the agent made."""

    def __init__(self, sysfs: FakeSysfs, iommu: bool = True) -> None:
        super().__init__(sysfs.root, modprobe=("true",), settle_seconds=1.0)
        self.sysfs = sysfs
        self.iommu_groups = iommu
        self.writes: list[str] = []

    def add_pf(self, address: str, netdev: str, totalvfs: int = 7, mtu: int = 1500) -> None:
        self.sysfs.add_pf(
            address, netdev, device="10c9", driver="igb", totalvfs=totalvfs, mtu=mtu,
            mac="52:54:00:12:34:56", flags=0x1003,
        )  # fmt: skip
        (self.sysfs.dev_dir(address) / "net" / netdev / "speed").write_text("1000\n")

    def set_num_vfs(self, pf: str, count: int) -> None:
        numvfs = self.sysfs.dev_dir(pf) / "sriov_numvfs"
        if int(numvfs.read_text()) == count:
            return
        self.writes.append(f"{pf} sriov_numvfs {count}")
        for link in self.sysfs.dev_dir(pf).glob("virtfn*"):
            address = link.resolve().name
            shutil.rmtree(link.resolve())
            (self.sysfs.bus / address).unlink()
            link.unlink()
        numvfs.write_text("0\n")
        netdev = os.listdir(self.sysfs.dev_dir(pf) / "net")[0]
        for index in range(count):
            self.sysfs.add_vf(
                pf, index, vf_address(pf, index), netdev=f"{netdev}v{index}", device="10ca",
                driver=VF_DRIVER, mtu=1500, flags=0x1002, mac=vf_mac(index),
                iommu_group=100 + index if self.iommu_groups else None,
            )  # fmt: skip

    def bind(self, vf: str, driver: str) -> None:
        self.writes.append(f"{vf} bind {driver}")
        if driver != NETDEVICE and not self.iommu(vf):
            super().bind(vf, driver)  # the real checks: raises the reboot-needing HostError
        self.set_driver(vf, VF_DRIVER if driver == NETDEVICE else driver)

    def set_driver(self, vf: str, driver: str) -> None:
        """What `driver_override` + `drivers_probe` leave: a new driver, a netdev or none."""
        dev = self.sysfs.dev_dir(vf)
        (dev / "driver").unlink(missing_ok=True)
        drv = self.sysfs.root / "bus" / "pci" / "drivers" / driver
        drv.mkdir(exist_ok=True)
        os.symlink(os.path.relpath(drv, dev), dev / "driver")
        pf = (dev / "physfn").resolve().name
        index = next(
            int(p.name.removeprefix("virtfn"))
            for p in self.sysfs.dev_dir(pf).glob("virtfn*")
            if p.resolve() == dev
        )
        net = dev / "net" / f"{os.listdir(self.sysfs.dev_dir(pf) / 'net')[0]}v{index}"
        if driver == VF_DRIVER and not net.exists():
            net.mkdir(parents=True)
            settings = {"type": "1", "operstate": "up", "mtu": "1500", "flags": "0x1002"}
            for name, value in {**settings, "address": vf_mac(index)}.items():
                (net / name).write_text(value + "\n")
        elif driver != VF_DRIVER and (dev / "net").exists():
            shutil.rmtree(dev / "net")

    def set_mtu(self, pci: str, netdev: str, mtu: int) -> None:
        self.writes.append(f"{netdev} mtu {mtu}")
        super().set_mtu(pci, netdev, mtu)

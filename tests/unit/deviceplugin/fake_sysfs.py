"""A FAKE sysfs tree for device plugin tests.

The host kernel has no SR-IOV (no CONFIG_PCI_IOV), so unit tests cannot see real VFs.
This builds the parts of /sys the discovery reads, shaped like the real thing: device
dirs under `devices/pci0000:00/`, `bus/pci/devices/<addr>` symlinks to them, and the
`driver`, `iommu_group`, `physfn` and `virtfnN` symlinks. Real-kernel behaviour is
checked in the VM (tests/vm/guest/test_dp_discovery.py).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

ETHER = 1
INFINIBAND = 32


class FakeSysfs:
    """Builder of a fake sysfs root; `root` is what discovery is pointed at."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.pci = root / "devices" / "pci0000:00"
        self.bus = root / "bus" / "pci" / "devices"
        self.pci.mkdir(parents=True)
        self.bus.mkdir(parents=True)
        (root / "bus" / "pci" / "drivers").mkdir()
        (root / "kernel" / "iommu_groups").mkdir(parents=True)

    def dev_dir(self, address: str) -> Path:
        return self.pci / address

    def add_device(
        self,
        address: str,
        *,
        vendor: str = "8086",
        device: str = "1572",
        pci_class: str = "0x020000",
        driver: str = "i40e",
        netdev: str | None = None,
        link_type: int = ETHER,
        operstate: str = "up",
        numa_node: int = 0,
        iommu_group: int | None = None,
        acpi_index: int | None = None,
        rdma: str | None = None,
        vdpa_driver: str | None = None,
        real_netdev: bool = False,
        mtu: int | None = None,
        mac: str = "",
        flags: int | None = None,
    ) -> Path:
        """One PCI function; returns its directory. With `real_netdev` its netdev entry is
        a symlink to the real /sys/class/net/<netdev> of the reading process's namespace,
        so link state and kernel events are real."""
        d = self.dev_dir(address)
        d.mkdir()
        (d / "class").write_text(pci_class + "\n")
        (d / "vendor").write_text(f"0x{vendor}\n")
        (d / "device").write_text(f"0x{device}\n")
        (d / "numa_node").write_text(f"{numa_node}\n")
        if driver:
            drv = self.root / "bus" / "pci" / "drivers" / driver
            drv.mkdir(exist_ok=True)
            os.symlink(os.path.relpath(drv, d), d / "driver")
        if netdev and real_netdev:
            (d / "net").mkdir()
            (d / "net" / netdev).symlink_to(f"/sys/class/net/{netdev}")
        elif netdev:
            net = d / "net" / netdev
            net.mkdir(parents=True)
            (net / "type").write_text(f"{link_type}\n")
            (net / "operstate").write_text(operstate + "\n")
            settings = {"mtu": mtu, "address": mac or None, "flags": flags and hex(flags)}
            for name, value in settings.items():
                if value is not None:
                    (net / name).write_text(f"{value}\n")
        if iommu_group is not None:
            group = self.root / "kernel" / "iommu_groups" / str(iommu_group)
            group.mkdir(exist_ok=True)
            os.symlink(os.path.relpath(group, d), d / "iommu_group")
        if acpi_index is not None:
            (d / "acpi_index").write_text(f"{acpi_index}\n")
        if rdma:
            (d / "infiniband" / rdma).mkdir(parents=True)
        if vdpa_driver:
            vdpa = d / "vdpa0"
            vdpa.mkdir()
            vdrv = self.root / "bus" / "vdpa" / "drivers" / vdpa_driver
            vdrv.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(vdrv, vdpa), vdpa / "driver")
        os.symlink(os.path.relpath(d, self.bus), self.bus / address)
        return d

    def add_pf(
        self, address: str, netdev: str, *, numvfs: int = 0, totalvfs: int = 8, **kw: Any
    ) -> Path:
        """An SR-IOV capable PF (without VFs yet: add them with add_vf)."""
        d = self.add_device(address, netdev=netdev, **kw)
        (d / "sriov_numvfs").write_text(f"{numvfs}\n")
        (d / "sriov_totalvfs").write_text(f"{totalvfs}\n")
        return d

    def add_vf(
        self,
        pf_address: str,
        index: int,
        address: str,
        *,
        netdev: str | None = None,
        device: str = "154c",
        driver: str = "iavf",
        **kw: Any,
    ) -> Path:
        """VF `index` of a PF: the physfn/virtfnN links, and the PF's sriov_numvfs bumped."""
        pf = self.dev_dir(pf_address)
        d = self.add_device(address, netdev=netdev, device=device, driver=driver, **kw)
        os.symlink(os.path.relpath(pf, d), d / "physfn")
        os.symlink(os.path.relpath(d, pf), pf / f"virtfn{index}")
        numvfs = pf / "sriov_numvfs"
        numvfs.write_text(f"{int(numvfs.read_text()) + 1}\n")
        return d

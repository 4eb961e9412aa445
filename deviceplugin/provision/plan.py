"""What must change on each PF to reach its desired config, and which existing VFs that touches.

A plan is pure: the desired configs, what sysfs shows now and the records in, the writes out.
A VF is *touched* when the plan destroys it (any new `sriov_numvfs` on a PF that has VFs:
the kernel only goes through 0) or moves it to another driver. Raising a PF's MTU, a VF's
MTU and pool membership touch nothing. VFs with no netdev in this namespace although a
kernel network driver holds them are in a pod; their MTU is left to when they come back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from deviceplugin.dra.bind import NETDEVICE
from deviceplugin.provision.crs import VFIO_PCI, PfConfig
from deviceplugin.provision.record import PfRecord
from deviceplugin.sysfs import USERSPACE_DRIVERS, PciNetDevice


@dataclass(frozen=True)
class PfPlan:
    """The writes for one PF, in the order they are made."""

    pci: str
    netdev: str
    desired: PfConfig | None  # None: Plexus's config of this PF is being removed
    pf_mtu: int | None = None  # set the PF's MTU to this
    num_vfs: int | None = None  # write sriov_numvfs (through 0 when it has VFs)
    binds: tuple[tuple[str, str], ...] = ()  # (VF, driver: "netdevice" or "vfio-pci")
    vf_mtus: tuple[tuple[str, str, int], ...] = ()  # (VF, its netdev, MTU)
    link_up: bool = False
    touched: frozenset[str] = frozenset()  # existing VFs destroyed or rebound

    @property
    def empty(self) -> bool:
        return not (
            self.pf_mtu or self.num_vfs is not None or self.binds or self.vf_mtus or self.link_up
        )


@dataclass
class Plans:
    """The plans of every PF that needs a change, and the records to drop."""

    pfs: list[PfPlan] = field(default_factory=list)
    forget: list[str] = field(default_factory=list)  # records of PFs that need nothing more


def driver_ok(device_type: str, driver: str) -> bool:
    """Does a VF bound to `driver` serve a group of `device_type`?"""
    if device_type == VFIO_PCI:
        return driver == VFIO_PCI
    return bool(driver) and driver not in USERSPACE_DRIVERS


def in_a_pod(vf: PciNetDevice) -> bool:
    """A kernel network driver holds it but its netdev is not here: moved into a pod."""
    return bool(vf.driver) and vf.driver not in USERSPACE_DRIVERS and not vf.netdevs


def vfs_of(pf: str, devices: Iterable[PciNetDevice]) -> list[PciNetDevice]:
    """The PF's VFs by VF index."""
    found = [d for d in devices if d.pf_address == pf and d.vf_index is not None]
    return sorted(found, key=lambda d: d.vf_index or 0)


def plan(
    desired: Sequence[PfConfig],
    devices: Sequence[PciNetDevice],
    records: Mapping[str, PfRecord],
) -> Plans:
    """The plans that make the host match `desired`, and reset recorded PFs left out."""
    by_address = {d.address: d for d in devices}
    out = Plans()
    wanted = {c.pci_address: c for c in desired}
    for pci, config in wanted.items():
        pf = by_address.get(pci)
        if pf is not None:
            p = _configure(config, pf, vfs_of(pci, devices))
            if not p.empty:
                out.pfs.append(p)
    for pci, record in records.items():
        if pci in wanted:
            continue
        pf = by_address.get(pci)
        if pf is None:
            continue  # gone (hot-unplugged?): kept, to reset if it comes back
        p = _reset(record, pf, vfs_of(pci, devices))
        if p.empty:
            out.forget.append(pci)
        else:
            out.pfs.append(p)
    return out


def _configure(config: PfConfig, pf: PciNetDevice, vfs: list[PciNetDevice]) -> PfPlan:
    managed = not config.externally_managed
    current = pf.sriov_numvfs or 0
    num_vfs = config.num_vfs if managed and current != config.num_vfs else None
    pf_mtu = None
    if managed and config.mtu and pf.mtu is not None and config.mtu > pf.mtu:
        pf_mtu = config.mtu  # never lowered, as the operator
    binds: list[tuple[str, str]] = []
    vf_mtus: list[tuple[str, str, int]] = []
    if num_vfs is None:  # the VFs stay: fix the ones that differ
        for vf in vfs:
            assert vf.vf_index is not None
            group = config.group_of(vf.vf_index)
            if group is None:
                continue
            if not driver_ok(group.device_type, vf.driver):
                binds.append((vf.address, VFIO_PCI if group.device_type == VFIO_PCI else NETDEVICE))
            elif group.device_type != VFIO_PCI and group.mtu and vf.netdev and vf.mtu != group.mtu:
                vf_mtus.append((vf.address, vf.netdev, group.mtu))
    touched = {vf.address for vf in vfs} if num_vfs is not None and current else set()
    touched |= {address for address, _ in binds}
    return PfPlan(
        pci=pf.address,
        netdev=pf.netdev,
        desired=config,
        pf_mtu=pf_mtu,
        num_vfs=num_vfs,
        binds=tuple(binds),
        vf_mtus=tuple(vf_mtus),
        link_up=managed and bool(pf.netdev) and not pf.admin_up,
        touched=frozenset(touched),
    )


def _reset(record: PfRecord, pf: PciNetDevice, vfs: list[PciNetDevice]) -> PfPlan:
    """Undo what the record says Plexus did: its VFs and its MTU raise."""
    if record.externally_managed:
        return PfPlan(pci=pf.address, netdev=pf.netdev, desired=None)
    num_vfs = 0 if record.created_vfs and (pf.sriov_numvfs or 0) else None
    mtu, raised = record.original_mtu, record.config.mtu
    pf_mtu = mtu if mtu is not None and pf.mtu == raised and raised != mtu else None
    return PfPlan(
        pci=pf.address,
        netdev=pf.netdev,
        desired=None,
        pf_mtu=pf_mtu,
        num_vfs=num_vfs,
        touched=frozenset(vf.address for vf in vfs) if num_vfs is not None else frozenset(),
    )

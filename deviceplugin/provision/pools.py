"""The device plugin's resources from the merged PF configs: one pool per policy resource.

A pool lists its VFs by PCI address: those in one of its VF groups' ranges that have the
group's driver, so a VF is never offered before it is configured (nor while a rebind waits
for its pod) and the PF's name does not matter. A VF a pod holds under another resource
(its group was renamed or repartitioned under it) is left out of the new pool until it is
released, so the kubelet cannot hand it out twice. `isRdma`, `needVhostNet` and the link
type (netdevice groups only) come along as the operator gives them to its device plugin.
A resource with no such VF has no pool until it has one.
"""

from __future__ import annotations

from collections.abc import Sequence

from deviceplugin.config import NetDeviceSelector, ResourceConfig
from deviceplugin.provision.crs import VFIO_PCI, PfConfig, VfGroup
from deviceplugin.provision.holders import Allocations, Holder
from deviceplugin.provision.plan import driver_ok, vfs_of
from deviceplugin.sysfs import PciNetDevice

DEFAULT_PREFIX = "openshift.io"  # the operator's RESOURCE_PREFIX default
LINK_TYPES = {"eth": "ether", "ib": "infiniband"}


def held_elsewhere(holders: set[Holder], resource: str) -> bool:
    """Held, and not (only) as `resource`: by another resource or by an unknown holder."""
    if not holders:
        return False
    known = {h.resource for h in holders if h.resource}
    return known != {resource}


def _selector(group: VfGroup, addresses: list[str]) -> NetDeviceSelector:
    link = LINK_TYPES.get(group.link_type.lower()) if group.device_type != VFIO_PCI else None
    return NetDeviceSelector(
        pci_addresses=addresses,
        is_rdma=group.is_rdma,
        need_vhost_net=group.need_vhost_net,
        link_types=[link] if link else [],
    )


def resources(
    configs: Sequence[PfConfig],
    devices: Sequence[PciNetDevice],
    allocations: Allocations | None = None,
    prefix: str = DEFAULT_PREFIX,
) -> list[ResourceConfig]:
    """One ResourceConfig per resource name that has a VF ready, sorted by name."""
    held = allocations or {}
    selectors: dict[str, list[NetDeviceSelector]] = {}
    topology: dict[str, bool] = {}
    for config in configs:
        vfs = vfs_of(config.pci_address, devices)
        for group in config.vf_groups:
            full = f"{prefix}/{group.resource_name}"
            topology.setdefault(group.resource_name, group.exclude_topology)
            ready = [
                vf.address
                for vf in vfs
                if vf.vf_index is not None
                and group.first <= vf.vf_index <= group.last
                and driver_ok(group.device_type, vf.driver)
                and not held_elsewhere(held.get(vf.address, set()), full)
            ]
            if ready:
                selectors.setdefault(group.resource_name, []).append(_selector(group, ready))
    return [
        ResourceConfig(
            resource_name=name,
            resource_prefix=prefix,
            exclude_topology=topology[name],
            selectors=found,
        )
        for name, found in sorted(selectors.items())
    ]

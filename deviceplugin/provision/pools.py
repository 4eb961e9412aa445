"""The device plugin's resources from the merged PF configs: one pool per policy resource.

Each VF group becomes one selector naming its PF by PCI address and its VF range
(`rootDevices: ["0000:3b:00.0#0-3"]`), so a pool holds exactly the VFs the merge gave that
resource, whatever the PF is called and whatever else matches its vendor; `isRdma`,
`needVhostNet` and the link type (netdevice groups only: a vfio-pci VF has no netdev to
read it from) come along as the operator passes them to its device plugin.
"""

from __future__ import annotations

from collections.abc import Sequence

from deviceplugin.config import NetDeviceSelector, ResourceConfig
from deviceplugin.provision.crs import VFIO_PCI, PfConfig, VfGroup

DEFAULT_PREFIX = "openshift.io"  # the operator's RESOURCE_PREFIX default
LINK_TYPES = {"eth": "ether", "ib": "infiniband"}


def _selector(pci: str, group: VfGroup) -> NetDeviceSelector:
    link = LINK_TYPES.get(group.link_type.lower()) if group.device_type != VFIO_PCI else None
    return NetDeviceSelector(
        root_devices=[f"{pci}#{group.vf_range}"],
        is_rdma=group.is_rdma,
        need_vhost_net=group.need_vhost_net,
        link_types=[link] if link else [],
    )


def resources(configs: Sequence[PfConfig], prefix: str = DEFAULT_PREFIX) -> list[ResourceConfig]:
    """One ResourceConfig per resource name (sorted), its selectors in PF order."""
    by_name: dict[str, list[tuple[str, VfGroup]]] = {}
    for config in configs:
        for group in config.vf_groups:
            by_name.setdefault(group.resource_name, []).append((config.pci_address, group))
    return [
        ResourceConfig(
            resource_name=name,
            resource_prefix=prefix,
            exclude_topology=groups[0][1].exclude_topology,
            selectors=[_selector(pci, g) for pci, g in groups],
        )
        for name, groups in sorted(by_name.items())
    ]

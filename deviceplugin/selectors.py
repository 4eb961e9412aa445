"""Resource pools: which discovered devices each configured resource offers.

Within one selector object every given key must match (AND); a device matches a
resource when any of its selector objects matches (OR). Each device goes to the first
resource in `resourceList` order that matches it. PFs with VFs enabled and devices whose
netdev carries a default route are never offered.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from deviceplugin.config import DevicePluginConfig, NetDeviceSelector, parse_vf_spec
from deviceplugin.sysfs import PciNetDevice

UNHEALTHY_OPERSTATES = frozenset({"down", "lowerlayerdown", "notpresent"})


def _vf_spec_matches(specs: Iterable[str], name: str | None, dev: PciNetDevice) -> bool:
    """`name` / `name#ranges` specs against a VF's PF (or a PF itself without ranges)."""
    for spec in specs:
        spec_name, indexes = parse_vf_spec(spec)
        if name is not None and spec_name.lower() == name.lower():
            if indexes is None:
                return True
            if dev.vf_index is not None and dev.vf_index in indexes:
                return True
    return False


def selector_matches(sel: NetDeviceSelector, dev: PciNetDevice) -> bool:
    """Does `dev` satisfy every key set in `sel`? (An empty selector matches anything.)"""
    if sel.vendors and dev.vendor not in sel.vendors:
        return False
    if sel.devices and dev.device not in sel.devices:
        return False
    if sel.drivers and dev.driver not in sel.drivers:
        return False
    if sel.pci_addresses and dev.address not in sel.pci_addresses:
        return False
    if sel.acpi_indexes and dev.acpi_index not in sel.acpi_indexes:
        return False
    if sel.pf_names:
        # A VF is matched by its PF's netdev; a device that is no VF by its own netdev.
        name = dev.pf_netdev if dev.is_vf else (dev.netdev or None)
        if not _vf_spec_matches(sel.pf_names, name, dev):
            return False
    if sel.root_devices:
        root = dev.pf_address if dev.is_vf else dev.address
        if not _vf_spec_matches(sel.root_devices, root, dev):
            return False
    if sel.link_types and dev.link_type not in sel.link_types:
        return False
    if sel.is_rdma and not dev.rdma:
        return False
    return not (sel.vdpa_type and dev.vdpa_type != sel.vdpa_type)


def offerable(dev: PciNetDevice) -> bool:
    """False for PFs with VFs enabled and for devices carrying a default route."""
    return not dev.has_vfs and not dev.default_route


def build_pools(
    config: DevicePluginConfig, devices: Iterable[PciNetDevice]
) -> dict[str, list[PciNetDevice]]:
    """`prefix/name` -> devices, every resource present (maybe empty), first match wins."""
    pools: dict[str, list[PciNetDevice]] = {r.full_name: [] for r in config.resource_list}
    for dev in devices:
        if not offerable(dev):
            continue
        for res in config.resource_list:
            if any(selector_matches(sel, dev) for sel in res.selectors):
                pools[res.full_name].append(dev)
                break
    return pools


def healthy(dev: PciNetDevice, by_address: Mapping[str, PciNetDevice]) -> bool:
    """Healthy: a driver holds it and its link is not down (a VF follows its PF's link).

    A device without a netdev (bound to vfio-pci, or a VF whose netdev is in a pod's
    namespace) has no operstate and counts as healthy; so does "unknown", which many
    drivers report for a working link. A device with no driver bound is unhealthy.
    """
    if not dev.driver:
        return False
    pf = by_address.get(dev.pf_address) if dev.pf_address else None
    state = pf.operstate if pf is not None else dev.operstate
    return state not in UNHEALTHY_OPERSTATES


def pools_report(
    config: DevicePluginConfig, devices: list[PciNetDevice]
) -> dict[str, list[dict[str, object]]]:
    """The JSON `plexus deviceplugin list` prints."""
    by_address = {d.address: d for d in devices}
    return {
        name: [
            {
                "id": dev.address,
                "pf": (dev.pf_netdev if dev.is_vf else dev.netdev) or "",
                "driver": dev.driver,
                "numa": dev.numa_node,
                "healthy": healthy(dev, by_address),
            }
            for dev in pool
        ]
        for name, pool in build_pools(config, devices).items()
    }

"""ResourceSlices (resource.k8s.io/v1) for this node's pools: what to publish.

One pool per node and `config.json` resource: pool name `<node>/<prefix>/<name>` (the
resource name lower-cased, `_` -> `-`: pool names are DNS subdomains joined by `/`), one
device per VF named after its PCI address (`0000:03:10.1` -> `vf-0000-03-10-1`), at most
`MAX_DEVICES` per slice (a bigger pool spans several slices, `resourceSliceCount` says
how many). Slices are named `<node>-<prefix>-<name>-<n>` and owned by the Node, so they
go when the Node does.

Attributes: `k8s.cni.cncf.io/resourceName` and `k8s.cni.cncf.io/deviceID` (what a Multus
DRA setup matches NADs on), `resource.kubernetes.io/pcieRoot` (the standard name, for
alignment with other drivers' devices), and in the driver's own domain (unqualified)
pciAddress, pfName, vendor, device, driver, numaNode, pcieRoot, linkType.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from deviceplugin.sysfs import PciNetDevice

DRIVER = "sriov.plexus.io"
API_VERSION = "resource.k8s.io/v1"
MAX_DEVICES = 128  # the API's limit per slice
RESOURCE_NAME_ATTR = "k8s.cni.cncf.io/resourceName"
DEVICE_ID_ATTR = "k8s.cni.cncf.io/deviceID"
PCIE_ROOT_ATTR = "resource.kubernetes.io/pcieRoot"
_NOT_DNS = re.compile(r"[^a-z0-9.-]")

Json = dict[str, Any]


def device_name(address: str) -> str:
    """`0000:03:10.1` -> `vf-0000-03-10-1` (a DNS label, as device names must be)."""
    return "vf-" + address.lower().replace(":", "-").replace(".", "-")


def _dns(text: str) -> str:
    return _NOT_DNS.sub("-", text.lower().replace("_", "-"))


def pool_name(node: str, resource: str) -> str:
    """`node`, `intel.com/sriov_a` -> `node/intel.com/sriov-a`."""
    prefix, _, name = resource.partition("/")
    return f"{node}/{_dns(prefix)}/{_dns(name)}"


def slice_name(node: str, resource: str, index: int) -> str:
    prefix, _, name = resource.partition("/")
    return f"{node}-{_dns(prefix)}-{_dns(name)}-{index}"


def device_attributes(resource: str, dev: PciNetDevice) -> Json:
    """The `attributes` map of one VF's device."""
    attrs: Json = {
        RESOURCE_NAME_ATTR: {"string": resource},
        DEVICE_ID_ATTR: {"string": dev.address},
        "pciAddress": {"string": dev.address},
        "vendor": {"string": dev.vendor},
        "device": {"string": dev.device},
        "driver": {"string": dev.driver},
        "linkType": {"string": dev.link_type},
    }
    pf = dev.pf_netdev if dev.is_vf else dev.netdev
    if pf:
        attrs["pfName"] = {"string": pf}
    if dev.numa_node is not None:
        attrs["numaNode"] = {"int": dev.numa_node}
    if dev.pcie_root:
        attrs["pcieRoot"] = {"string": dev.pcie_root}
        attrs[PCIE_ROOT_ATTR] = {"string": dev.pcie_root}
    return attrs


def pool_slices(
    node: str,
    node_uid: str,
    resource: str,
    devices: Sequence[PciNetDevice],
    generation: int,
) -> list[Json]:
    """The slices of one pool (one, with no devices, for an empty pool)."""
    chunks = [devices[i : i + MAX_DEVICES] for i in range(0, len(devices), MAX_DEVICES)] or [[]]
    owner = {"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": True}
    return [
        {
            "apiVersion": API_VERSION,
            "kind": "ResourceSlice",
            "metadata": {"name": slice_name(node, resource, i), "ownerReferences": [owner]},
            "spec": {
                "driver": DRIVER,
                "nodeName": node,
                "pool": {
                    "name": pool_name(node, resource),
                    "generation": generation,
                    "resourceSliceCount": len(chunks),
                },
                "devices": [
                    {"name": device_name(d.address), "attributes": device_attributes(resource, d)}
                    for d in chunk
                ],
            },
        }
        for i, chunk in enumerate(chunks)
    ]


def node_slices(
    node: str,
    node_uid: str,
    pools: Mapping[str, Sequence[PciNetDevice]],
    generations: Mapping[str, int],
) -> dict[str, Json]:
    """Every slice this node should have, by name."""
    return {
        s["metadata"]["name"]: s
        for resource, devices in pools.items()
        for s in pool_slices(node, node_uid, resource, devices, generations.get(resource, 1))
    }

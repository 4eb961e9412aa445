"""Builders for the provisioning unit tests: policies as the API returns them, and PFs/VFs
as discovery reports them (plain PciNetDevice values; no sysfs involved)."""

from __future__ import annotations

from typing import Any

from deviceplugin.provision.crs import NodePolicy
from deviceplugin.sysfs import PciNetDevice

NS = "sriov-network-operator"


def policy(name: str, created: str = "2026-01-01T00:00:00Z", **spec: Any) -> NodePolicy:
    body = {"resourceName": name.replace("-", "_"), "nodeSelector": {}, "numVfs": 4}
    return NodePolicy.from_api(
        {
            "kind": "SriovNetworkNodePolicy",
            "metadata": {"name": name, "namespace": NS, "creationTimestamp": created},
            "spec": {**body, **spec},
        }
    )


def pf(address: str, netdev: str, total: int = 8, numvfs: int = 0, **kw: Any) -> PciNetDevice:
    fields: dict[str, Any] = dict(
        address=address,
        vendor="8086",
        device="10c9",
        driver="igb",
        numa_node=0,
        netdevs=(netdev,),
        link_type="ether",
        operstate="up",
        iommu_group=None,
        rdma=(),
        acpi_index=None,
        vdpa_type=None,
        sriov_numvfs=numvfs,
        sriov_totalvfs=total,
        mtu=1500,
        admin_up=True,
    )
    return PciNetDevice(**{**fields, **kw})


def vf(parent: PciNetDevice, index: int, driver: str = "igbvf", **kw: Any) -> PciNetDevice:
    slot = 2 + 4 * int(parent.address[-1]) + index // 8  # PF 0000:3b:00.1 -> 0000:3b:06.x
    fields: dict[str, Any] = dict(
        address=f"{parent.address[:8]}{slot:02x}.{index % 8}",
        vendor="8086",
        device="10ca",
        driver=driver,
        numa_node=0,
        netdevs=(f"{parent.netdev}v{index}",) if driver == "igbvf" else (),
        link_type="ether",
        operstate="up",
        iommu_group=None,
        rdma=(),
        acpi_index=None,
        vdpa_type=None,
        pf_address=parent.address,
        pf_netdev=parent.netdev,
        vf_index=index,
        mtu=1500 if driver == "igbvf" else None,
    )
    return PciNetDevice(**{**fields, **kw})

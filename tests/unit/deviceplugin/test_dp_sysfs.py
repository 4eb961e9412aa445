"""Discovery of PCI network devices from a FAKE sysfs tree (the host has no SR-IOV)."""

from __future__ import annotations

from pathlib import Path

from deviceplugin.sysfs import PciNetDevice, default_route_ifaces, discover
from tests.unit.deviceplugin.fake_sysfs import INFINIBAND, FakeSysfs

PF = "0000:3b:00.0"


def by_address(devices: list[PciNetDevice]) -> dict[str, PciNetDevice]:
    return {d.address: d for d in devices}


def test_pf_and_vfs(fake_sysfs: FakeSysfs) -> None:
    fake_sysfs.add_pf(PF, "ens1f0", iommu_group=40, numa_node=1, acpi_index=3)
    fake_sysfs.add_vf(PF, 0, "0000:3b:02.0", netdev="ens1f0v0", iommu_group=41, numa_node=1)
    fake_sysfs.add_vf(PF, 1, "0000:3b:02.1", driver="vfio-pci", numa_node=1)
    devs = by_address(discover(fake_sysfs.root))
    assert list(devs) == [PF, "0000:3b:02.0", "0000:3b:02.1"]

    pf = devs[PF]
    assert (pf.vendor, pf.device, pf.driver) == ("8086", "1572", "i40e")
    assert pf.netdevs == ("ens1f0",) and pf.netdev == "ens1f0"
    assert (pf.link_type, pf.operstate) == ("ether", "up")
    assert (pf.numa_node, pf.iommu_group, pf.acpi_index) == (1, "40", "3")
    assert (pf.sriov_numvfs, pf.sriov_totalvfs) == (2, 8)
    assert pf.has_vfs and not pf.is_vf
    assert (pf.pf_address, pf.pf_netdev, pf.vf_index) == (None, None, None)

    vf0 = devs["0000:3b:02.0"]
    assert vf0.is_vf and not vf0.has_vfs
    assert (vf0.pf_address, vf0.pf_netdev, vf0.vf_index) == (PF, "ens1f0", 0)
    assert (vf0.device, vf0.driver, vf0.netdev, vf0.iommu_group) == (
        "154c",
        "iavf",
        "ens1f0v0",
        "41",
    )
    assert vf0.sriov_numvfs is None

    vf1 = devs["0000:3b:02.1"]  # DPDK mode: vfio-pci, no netdev
    assert (vf1.driver, vf1.netdevs, vf1.netdev, vf1.vf_index) == ("vfio-pci", (), "", 1)
    assert (vf1.link_type, vf1.operstate, vf1.iommu_group) == ("", "", None)


def test_only_network_class_devices(fake_sysfs: FakeSysfs) -> None:
    fake_sysfs.add_device("0000:00:1f.2", pci_class="0x010601", driver="ahci")
    fake_sysfs.add_device("0000:00:03.0", pci_class="0x028000", netdev="wlan0")
    assert [d.address for d in discover(fake_sysfs.root)] == ["0000:00:03.0"]


def test_unbound_device_and_no_numa(fake_sysfs: FakeSysfs) -> None:
    fake_sysfs.add_device("0000:05:00.0", driver="", numa_node=-1)
    (dev,) = discover(fake_sysfs.root)
    assert (dev.driver, dev.numa_node, dev.netdevs, dev.acpi_index) == ("", None, (), None)
    assert (dev.sriov_numvfs, dev.sriov_totalvfs, dev.vdpa_type) == (None, None, None)


def test_upper_case_ids_are_lowered(fake_sysfs: FakeSysfs) -> None:
    fake_sysfs.add_device("0000:05:00.0", vendor="15B3", device="101E")
    (dev,) = discover(fake_sysfs.root)
    assert (dev.vendor, dev.device) == ("15b3", "101e")


def test_infiniband_rdma_and_link_types(fake_sysfs: FakeSysfs) -> None:
    fake_sysfs.add_device("0000:06:00.0", vendor="15b3", netdev="ib0", link_type=INFINIBAND)
    fake_sysfs.add_device("0000:07:00.0", vendor="15b3", netdev="eth7", rdma="mlx5_1")
    fake_sysfs.add_device("0000:08:00.0", netdev="odd0", link_type=778)
    devs = by_address(discover(fake_sysfs.root))
    assert devs["0000:06:00.0"].link_type == "infiniband"
    assert devs["0000:06:00.0"].rdma == ()
    assert devs["0000:07:00.0"].rdma == ("mlx5_1",)
    assert devs["0000:07:00.0"].link_type == "ether"
    assert devs["0000:08:00.0"].link_type == "778"


def test_vdpa_type(fake_sysfs: FakeSysfs) -> None:
    fake_sysfs.add_device("0000:09:00.0", vdpa_driver="vhost_vdpa")
    fake_sysfs.add_device("0000:09:00.1", vdpa_driver="virtio_vdpa")
    devs = by_address(discover(fake_sysfs.root))
    assert devs["0000:09:00.0"].vdpa_type == "vhost"
    assert devs["0000:09:00.1"].vdpa_type == "virtio"


def test_numbers_with_leading_zeros(fake_sysfs: FakeSysfs) -> None:
    d = fake_sysfs.add_device("0000:0b:00.0", numa_node=1)
    (d / "numa_node").write_text("01\n")
    (dev,) = discover(fake_sysfs.root)
    assert dev.numa_node == 1


def test_operstate_down(fake_sysfs: FakeSysfs) -> None:
    fake_sysfs.add_device("0000:0a:00.0", netdev="eth10", operstate="down")
    (dev,) = discover(fake_sysfs.root)
    assert dev.operstate == "down"


def test_default_route_flag(fake_sysfs: FakeSysfs) -> None:
    fake_sysfs.add_device("0000:0a:00.0", netdev="eno1")
    fake_sysfs.add_device("0000:0a:00.1", netdev="eno2")
    devs = by_address(discover(fake_sysfs.root, {"eno1"}))
    assert devs["0000:0a:00.0"].default_route
    assert not devs["0000:0a:00.1"].default_route


def test_missing_root_is_empty(tmp_path: Path) -> None:
    assert discover(tmp_path / "nothing") == []


ROUTE = """\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eno1\t00000000\t0102A8C0\t0003\t0\t0\t100\t00000000\t0\t0\t0
eno1\t0002A8C0\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0
eno3\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
garbage\tzz\t00000000\t0001\t0\t0\t0\tzz\t0\t0\t0
"""
Z = "0" * 32
IPV6_ROUTE = f"""\
{Z} 00 {Z} 00 fe800000000000000000000000000001 00000400 00000001 00000000 00000003 eno4
fe800000000000000000000000000000 40 {Z} 00 {Z} 00000100 00000001 00000000 00000001 eno5
{Z} 00 {Z} 00 {Z} ffffffff 00000001 00000000 00200200 lo
{Z} 00 {Z} 00 {Z} ffffffff 00000001 00000000 00000200 eno6
not a route line
"""


def test_default_route_ifaces(tmp_path: Path) -> None:
    (tmp_path / "route").write_text(ROUTE)
    (tmp_path / "ipv6_route").write_text(IPV6_ROUTE)
    assert default_route_ifaces(tmp_path / "route", tmp_path / "ipv6_route") == {"eno1", "eno4"}


def test_default_route_ifaces_missing_files(tmp_path: Path) -> None:
    assert default_route_ifaces(tmp_path / "a", tmp_path / "b") == set()

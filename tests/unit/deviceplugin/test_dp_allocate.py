"""Allocate's env, DeviceSpecs and device-info files, and GetPreferredAllocation, over a
FAKE sysfs tree."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from cni.deviceinfo import dp_path
from deviceplugin.allocate import AllocationError, DeviceInfoFiles, container_response, env_name
from deviceplugin.config import ResourceConfig
from deviceplugin.preferred import preferred_allocation
from deviceplugin.sysfs import PciNetDevice, discover
from tests.unit.deviceplugin.fake_sysfs import FakeSysfs

PF0, PF1, PF2 = "0000:3b:00.0", "0000:3b:00.1", "0000:af:00.0"
VF0 = [f"0000:3b:02.{i}" for i in range(4)]  # PF0, NUMA 0, iavf
VF1 = [f"0000:3b:0a.{i}" for i in range(2)]  # PF1, NUMA 0, vfio-pci / igb_uio
VF2 = [f"0000:af:02.{i}" for i in range(3)]  # PF2, NUMA 1


@pytest.fixture
def pool(fake_sysfs: FakeSysfs) -> dict[str, PciNetDevice]:
    fake_sysfs.add_pf(PF0, "ens1f0")
    for i, addr in enumerate(VF0):
        fake_sysfs.add_vf(PF0, i, addr, netdev=f"ens1f0v{i}")
    fake_sysfs.add_pf(PF1, "ens1f1")
    fake_sysfs.add_vf(PF1, 0, VF1[0], driver="vfio-pci", iommu_group=42)
    uio = fake_sysfs.add_vf(PF1, 1, VF1[1], driver="igb_uio")
    (uio / "uio" / "uio3").mkdir(parents=True)
    fake_sysfs.add_pf(PF2, "ens2f0", numa_node=1)
    for i, addr in enumerate(VF2):
        fake_sysfs.add_vf(PF2, i, addr, netdev=f"ens2f0v{i}", numa_node=1)
    return {d.address: d for d in discover(fake_sysfs.root) if d.is_vf}


def resource(**extra: Any) -> ResourceConfig:
    return ResourceConfig.model_validate(
        {"resourceName": "sriov_a", "selectors": [{"vendors": ["8086"]}], **extra}
    )


def test_env_name() -> None:
    assert env_name("intel.com/sriov_a") == "PCIDEVICE_INTEL_COM_SRIOV_A"
    assert env_name("nvidia.com/cx-6") == "PCIDEVICE_NVIDIA_COM_CX_6"


def test_netdevice_vfs(
    pool: dict[str, PciNetDevice], fake_sysfs: FakeSysfs, tmp_path: Path
) -> None:
    devinfo = str(tmp_path / "devinfo")
    resp = container_response(
        resource(), [VF0[1], VF2[0]], pool, sysfs_root=fake_sysfs.root, devinfo_dir=devinfo
    )
    assert dict(resp.envs) == {
        "PCIDEVICE_INTEL_COM_SRIOV_A": f"{VF0[1]},{VF2[0]}",
        "PCIDEVICE_INTEL_COM_SRIOV_A_INFO": json.dumps(
            {VF0[1]: {"generic": {"deviceID": VF0[1]}}, VF2[0]: {"generic": {"deviceID": VF2[0]}}},
            separators=(",", ":"),
        ),
    }
    assert list(resp.devices) == [] and list(resp.mounts) == []
    path = dp_path(devinfo, "intel.com/sriov_a", VF0[1])
    assert json.loads(path.read_text()) == {
        "type": "pci",
        "version": "1.1.0",
        "pci": {"pci-address": VF0[1], "pf-pci-address": PF0},
    }
    assert stat.S_IMODE(path.stat().st_mode) == 0o444


def test_vfio_uio_and_vhost_net(
    pool: dict[str, PciNetDevice], fake_sysfs: FakeSysfs, tmp_path: Path
) -> None:
    dev = tmp_path / "dev"
    (dev / "vfio").mkdir(parents=True)
    (dev / "vfio" / "noiommu-42").touch()  # no-IOMMU mode names the group node so
    res = resource(selectors=[{"drivers": ["vfio-pci", "igb_uio"], "needVhostNet": True}])
    resp = container_response(
        res,
        VF1,
        pool,
        sysfs_root=fake_sysfs.root,
        dev_root=dev,
        devinfo_dir=str(tmp_path / "devinfo"),
    )
    specs = [(d.container_path, d.host_path, d.permissions) for d in resp.devices]
    assert specs == [
        (f"{dev}/vfio/vfio", f"{dev}/vfio/vfio", "mrw"),
        (f"{dev}/vfio/noiommu-42", f"{dev}/vfio/noiommu-42", "mrw"),
        (f"{dev}/uio3", f"{dev}/uio3", "mrw"),
        (f"{dev}/vhost-net", f"{dev}/vhost-net", "mrw"),
        (f"{dev}/net/tun", f"{dev}/net/tun", "mrw"),
    ]
    info = json.loads(resp.envs["PCIDEVICE_INTEL_COM_SRIOV_A_INFO"])
    assert info[VF1[0]]["vfio"] == {
        "mount": f"{dev}/vfio/vfio",
        "dev-mount": f"{dev}/vfio/noiommu-42",
    }
    assert info[VF1[1]]["uio"] == {"dev-mount": f"{dev}/uio3"}


def test_additional_info(
    pool: dict[str, PciNetDevice], fake_sysfs: FakeSysfs, tmp_path: Path
) -> None:
    res = resource(additionalInfo={"*": {"site": "a", "x": "1"}, VF0[0]: {"x": "2"}})
    resp = container_response(
        res, VF0[:2], pool, sysfs_root=fake_sysfs.root, devinfo_dir=str(tmp_path)
    )
    info = json.loads(resp.envs["PCIDEVICE_INTEL_COM_SRIOV_A_INFO"])
    assert info[VF0[0]]["extra"] == {"site": "a", "x": "2"}
    assert info[VF0[1]]["extra"] == {"site": "a", "x": "1"}


def test_unknown_device_is_refused_and_writes_nothing(
    pool: dict[str, PciNetDevice], fake_sysfs: FakeSysfs, tmp_path: Path
) -> None:
    with pytest.raises(AllocationError, match=r"no such device 0000:00:00\.7"):
        container_response(
            resource(),
            [VF0[0], "0000:00:00.7"],
            pool,
            sysfs_root=fake_sysfs.root,
            devinfo_dir=str(tmp_path / "d"),
        )
    assert not (tmp_path / "d").exists()


def test_uio_without_node_is_refused(pool: dict[str, PciNetDevice], tmp_path: Path) -> None:
    with pytest.raises(AllocationError, match="igb_uio but has no uio node"):
        container_response(
            resource(), [VF1[1]], pool, sysfs_root=tmp_path, devinfo_dir=str(tmp_path)
        )


@pytest.mark.parametrize(
    ("available", "must", "size", "expected"),
    [
        # one NUMA node, and the PF with most free VFs, before anything else
        (VF0 + VF2, [], 3, VF0[:3]),
        # a must-include on NUMA 1 pulls the rest there
        (VF0 + VF2, [VF2[2]], 3, [VF2[2], VF2[0], VF2[1]]),
        # NUMA 1 short of devices: spill to NUMA 0 only for what is missing
        (VF0[:1] + VF2, [VF2[0]], 4, [VF2[0], VF2[1], VF2[2], VF0[0]]),
        # the most-populated node wins when nothing is required
        (VF0[:1] + VF2, [], 2, VF2[:2]),
        # stay on the PF already used before opening another one on the same node
        ([VF0[0], VF0[3], *VF1], [VF1[0]], 2, [VF1[0], VF1[1]]),
        # size not above the must-includes: exactly those
        (VF0, [VF0[2], VF0[1]], 2, [VF0[2], VF0[1]]),
        # unknown IDs go last
        (["bogus", VF0[0]], [], 2, [VF0[0], "bogus"]),
    ],
)
def test_preferred_allocation(
    pool: dict[str, PciNetDevice],
    available: list[str],
    must: list[str],
    size: int,
    expected: list[str],
) -> None:
    assert preferred_allocation(available, must, size, pool) == expected


def test_device_info_files_follow_the_pool(pool: dict[str, PciNetDevice], tmp_path: Path) -> None:
    files = DeviceInfoFiles("intel.com/sriov_a", str(tmp_path))

    def written() -> list[str]:
        return sorted(p.name for p in (tmp_path / "dp").iterdir())

    files.sync({a: pool[a] for a in VF0[:2]})
    assert written() == [f"intel.com-sriov_a-{a}-device.json" for a in VF0[:2]]
    path = dp_path(str(tmp_path), "intel.com/sriov_a", VF0[1])
    inode = path.stat().st_ino
    files.sync({VF0[1]: pool[VF0[1]]})  # VF0[0] left the pool; VF0[1] is unchanged
    assert written() == [path.name] and path.stat().st_ino == inode
    files.clear()
    assert written() == []

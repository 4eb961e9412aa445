"""The DRA plugin's part of each discovery scan (deviceplugin/dra/plugin.py) on a FAKE sysfs:
the device-info files of its VFs, kept in step with the pools as the device plugin's are."""

from __future__ import annotations

import json
from pathlib import Path

from cni.deviceinfo import dp_path
from deviceplugin.dra.plugin import DraOptions, DraPlugin
from deviceplugin.sysfs import discover
from tests.unit.deviceplugin.fake_sysfs import FakeSysfs
from tests.unit.kube.test_kubeconfig import write_kubeconfig

RESOURCE = "intel.com/sriov_dra"
PF = "0000:03:00.0"
VFS = ["0000:03:02.0", "0000:03:02.1"]


def test_vfs_of_dra_pools_get_device_info_files(fake_sysfs: FakeSysfs, tmp_path: Path) -> None:
    fake_sysfs.add_pf(PF, "ens1f0")
    for index, address in enumerate(VFS):
        fake_sysfs.add_vf(PF, index, address, netdev=f"ens1f0v{index}")
    vfs = [d for d in discover(fake_sysfs.root) if d.address in VFS]
    devinfo = tmp_path / "devinfo"
    options = DraOptions(
        node_name="node-a",
        resources=frozenset({RESOURCE}),
        kubeconfig=write_kubeconfig(tmp_path / "kubeconfig", {}, {"token": "t"}),
        cdi_dir=tmp_path / "cdi",
        state_dir=tmp_path / "state",
        devinfo_dir=str(devinfo),
    )
    plugin = DraPlugin(options, tmp_path / "registry", fake_sysfs.root, tmp_path / "dev")

    plugin.update({RESOURCE: vfs}, {VFS[0]: True})  # an unhealthy VF has its file too

    for address in VFS:
        info = json.loads(dp_path(str(devinfo), RESOURCE, address).read_text())
        assert info == {
            "type": "pci",
            "version": "1.1.0",
            "pci": {"pci-address": address, "pf-pci-address": PF},
        }
    plugin.update({RESOURCE: vfs[:1]}, {VFS[0]: True})  # a VF left the pool
    assert not dp_path(str(devinfo), RESOURCE, VFS[1]).exists()
    assert dp_path(str(devinfo), RESOURCE, VFS[0]).exists()

"""SR-IOV provisioning (deviceplugin/provision) on QEMU's igb: real `sriov_numvfs` writes,
drivers moved between igbvf and vfio-pci (QEMU's emulated Intel IOMMU gives the VFs IOMMU
groups), MTUs, the records of what Plexus made, drift, boot order, and the device plugin's
pools following the policies while it keeps serving.

No API server runs in the VM: the policies go straight to the node pass, as the agent hands
them over (the agent's API side is tested in tests/cluster/test_sriov_agent.py). Everything
runs in the guest test process: no Python subprocesses (each costs seconds under TCG).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.config import DevicePluginConfig
from deviceplugin.kubelet import deviceplugin_pb2 as pb
from deviceplugin.plugin import DevicePluginRunner, PluginOptions, socket_name
from deviceplugin.provision.crs import NodePolicy
from deviceplugin.provision.holders import AllocationReader
from deviceplugin.provision.host import Host
from deviceplugin.provision.node import NodeProvisioner, PassResult
from deviceplugin.provision.record import Records
from deviceplugin.server import HostPaths
from tests.kubelet import next_until, plugin_stub, serve_registration
from tests.unit.deviceplugin.provision_helpers import policy
from tests.vm.guest.conftest import Pf, driver_of, pf_up, rebind, sh

PCI_DEVICES = Path("/sys/bus/pci/devices")


@pytest.fixture
def prov(igb_pf: Pf, tmp_path: Path) -> Iterator[NodeProvisioner]:
    """A node pass on the real /sys (no kubelet here: only the kernel says what is in use);
    afterwards the PF has no VFs, MTU 1500 and is down, every VF on its own driver."""
    pf_up(igb_pf)
    yield NodeProvisioner(
        Host(Path("/sys")), Records(tmp_path / "records"), AllocationReader(None, None)
    )
    for link in igb_pf.sysfs.glob("virtfn*"):
        pci = link.resolve().name
        if driver_of(pci) != "igbvf":
            rebind(pci, "")
    (igb_pf.sysfs / "sriov_numvfs").write_text("0")
    (igb_pf.sysfs / "net" / igb_pf.netdev / "mtu").write_text("1500")
    sh("ip", "link", "set", igb_pf.netdev, "down")


def pol(pf: Pf, name: str = "a", part: str = "", **spec: Any) -> NodePolicy:
    return policy(name, **{"nicSelector": {"pfNames": [pf.netdev + part]}, **spec})


def vfs(pf: Pf) -> list[str]:
    """The PF's VFs by index."""
    links = sorted(pf.sysfs.glob("virtfn*"), key=lambda p: int(p.name.removeprefix("virtfn")))
    return [link.resolve().name for link in links]


def pool(result: PassResult, name: str) -> list[str]:
    found = [r for r in result.resources if r.resource_name == name]
    return [a for r in found for s in r.selectors for a in s.pci_addresses]


def mtu(pci: str) -> int:
    (net,) = (PCI_DEVICES / pci / "net").iterdir()
    return int((net / "mtu").read_text())


def test_create_resize_and_reset_only_what_plexus_made(igb_pf: Pf, prov: NodeProvisioner) -> None:
    result = prov.reconcile([pol(igb_pf, numVfs=2, mtu=9000)], {})
    assert (result.errors, result.waiting) == ([], {})
    made = vfs(igb_pf)
    assert len(made) == 2 and pool(result, "a") == made
    assert mtu(igb_pf.pci) == 9000 and [mtu(v) for v in made] == [9000, 9000]
    result = prov.reconcile([pol(igb_pf, numVfs=5, mtu=9000)], {})  # free VFs: at once
    assert (result.errors, result.waiting) == ([], {})
    assert pool(result, "a") == vfs(igb_pf) and len(vfs(igb_pf)) == 5
    result = prov.reconcile([], {})
    assert vfs(igb_pf) == [] and mtu(igb_pf.pci) == 1500 and result.resources == []
    assert prov.records.load() == {}


def test_two_pools_on_one_pf_and_a_group_moved_to_vfio_pci_and_back(
    igb_pf: Pf, prov: NodeProvisioner
) -> None:
    net = pol(igb_pf, "net", "#0-1", numVfs=4, priority=10)
    dpdk = pol(igb_pf, "dpdk", "#2-3", numVfs=4, priority=10, deviceType="vfio-pci")
    result = prov.reconcile([net, dpdk], {})
    assert (result.errors, result.reboot) == ([], [])
    made = vfs(igb_pf)
    assert [driver_of(v) for v in made] == ["igbvf", "igbvf", "vfio-pci", "vfio-pci"]
    assert (pool(result, "net"), pool(result, "dpdk")) == (made[:2], made[2:])
    group = (PCI_DEVICES / made[2] / "iommu_group").resolve().name
    assert Path(f"/dev/vfio/{group}").exists()
    back = pol(igb_pf, "dpdk", "#2-3", numVfs=4, priority=10)
    result = prov.reconcile([net, back], {})
    assert vfs(igb_pf) == made  # the same VFs: rebound, not recreated
    assert [driver_of(v) for v in made] == ["igbvf"] * 4
    assert pool(result, "dpdk") == made[2:]


def test_an_externally_managed_pf_keeps_its_vfs(igb_pf: Pf, prov: NodeProvisioner) -> None:
    (igb_pf.sysfs / "sriov_numvfs").write_text("3")  # made by something else
    made = vfs(igb_pf)
    ext = pol(igb_pf, part="#1-2", numVfs=3, externallyManaged=True, deviceType="vfio-pci")
    result = prov.reconcile([ext], {})
    assert vfs(igb_pf) == made
    assert [driver_of(v) for v in made] == ["igbvf", "vfio-pci", "vfio-pci"]
    assert pool(result, "a") == made[1:]
    prov.reconcile([], {})
    assert vfs(igb_pf) == made  # never reset


def test_drift_is_restored(igb_pf: Pf, prov: NodeProvisioner) -> None:
    prov.reconcile([pol(igb_pf, numVfs=2, mtu=9000)], {})
    made = vfs(igb_pf)
    rebind(made[1], "vfio-pci")  # behind Plexus's back
    result = prov.reconcile([pol(igb_pf, numVfs=2, mtu=9000)], {})
    assert result.drift == [f"VF {made[1]} left its driver: bound to netdevice again"]
    assert driver_of(made[1]) == "igbvf" and pool(result, "a") == made
    (net,) = (PCI_DEVICES / made[0] / "net").iterdir()
    (net / "mtu").write_text("1400")
    result = prov.reconcile([pol(igb_pf, numVfs=2, mtu=9000)], {})
    assert len(result.drift) == 1 and "MTU changed" in result.drift[0]
    assert mtu(made[0]) == 9000


def test_the_device_plugin_follows_the_policies_without_a_restart_and_boots_after_the_vfs(
    igb_pf: Pf, prov: NodeProvisioner, tmp_path: Path
) -> None:
    plugins = tmp_path / "dp"
    plugins.mkdir()
    resource = "openshift.io/a"
    with serve_registration(plugins / "kubelet.sock") as kubelet:
        runner = DevicePluginRunner(
            DevicePluginConfig(resource_list=[]),
            PluginOptions(
                paths=HostPaths(devinfo_dir=str(tmp_path / "devinfo")), plugins_dir=plugins
            ),
        )
        serving = threading.Thread(target=runner.run)
        serving.start()
        try:
            runner.set_config(
                DevicePluginConfig(
                    resource_list=prov.reconcile([pol(igb_pf, numVfs=2)], {}).resources
                )
            )
            assert [r.resource_name for r in kubelet.wait_for(1, timeout=60)] == [resource]
            with plugin_stub(plugins / socket_name(resource)) as stub:
                stream = stub.ListAndWatch(pb.Empty(), timeout=120)
                assert sorted(next_until(stream, lambda d: len(d) == 2)) == vfs(igb_pf)
                result = prov.reconcile([pol(igb_pf, numVfs=3)], {})
                runner.set_config(DevicePluginConfig(resource_list=result.resources))
                # The same stream of the same server: nothing restarted.
                assert sorted(next_until(stream, lambda d: len(d) == 3)) == vfs(igb_pf)
        finally:
            runner.stop()
            serving.join(timeout=30)
    assert len(kubelet.requests) == 1  # registered once

    # A reboot: the kernel forgets the VFs. Boot applies the records before anything serves,
    # so the device plugin's very first list already holds the VFs.
    (igb_pf.sysfs / "sriov_numvfs").write_text("0")
    booted = NodeProvisioner(prov.host, prov.records, prov.allocations).boot()
    assert len(vfs(igb_pf)) == 3
    with serve_registration(plugins / "kubelet.sock"):
        runner = DevicePluginRunner(
            DevicePluginConfig(resource_list=booted.resources),
            PluginOptions(
                paths=HostPaths(devinfo_dir=str(tmp_path / "devinfo")), plugins_dir=plugins
            ),
        )
        serving = threading.Thread(target=runner.run)
        serving.start()
        try:
            with plugin_stub(plugins / socket_name(resource)) as stub:
                first = next(iter(stub.ListAndWatch(pb.Empty(), timeout=60)))
                assert sorted(d.ID for d in first.devices) == vfs(igb_pf)
        finally:
            runner.stop()
            serving.join(timeout=30)

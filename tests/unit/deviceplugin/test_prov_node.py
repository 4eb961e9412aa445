"""Provisioning passes (deviceplugin/provision/node.py) on a FAKE kernel (fake_kernel.py): what
is written, what waits for pods, the records, drift, reboots, and the pools that result."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deviceplugin.provision.holders import AllocationReader, Holder, KubeletAllocation
from deviceplugin.provision.node import NodeProvisioner
from deviceplugin.provision.record import Records
from deviceplugin.sysfs import discover
from tests.unit.deviceplugin.fake_kernel import FakeKernel, vf_address
from tests.unit.deviceplugin.fake_sysfs import FakeSysfs
from tests.unit.deviceplugin.provision_helpers import policy

PF = "0000:3b:00.0"
VF = [vf_address(PF, i) for i in range(7)]


class Node:
    """A FAKE kernel with one igb-like PF, a provisioner on it, and the kubelet's allocations."""

    def __init__(self, tmp: Path, iommu: bool = True) -> None:
        self.kernel = FakeKernel(FakeSysfs(tmp / "sys"), iommu=iommu)
        self.kernel.add_pf(PF, "ens1f0")
        self.kubelet: list[KubeletAllocation] = []
        self.records = Records(tmp / "records")
        self.prov = NodeProvisioner(
            self.kernel, self.records, AllocationReader(lambda: list(self.kubelet), None)
        )

    def hold(self, vf: str, resource: str = "openshift.io/a", pod: str = "p1") -> None:
        self.kubelet.append(KubeletAllocation("ns", pod, "", resource, (vf,)))

    def vfs(self) -> dict[str, str]:
        """VF address -> driver."""
        return {d.address: d.driver for d in discover(self.kernel.root) if d.is_vf}


@pytest.fixture
def node(tmp_path: Path) -> Node:
    return Node(tmp_path)


def pol(name: str = "a", **spec: Any) -> Any:
    return policy(name, **{"nicSelector": {"pfNames": ["ens1f0"]}, **spec})


def pool(result: Any, name: str) -> list[str]:
    (res,) = [r for r in result.resources if r.resource_name == name]
    return [a for s in res.selectors for a in s.pci_addresses]


def test_a_policy_creates_its_vfs_and_its_pool(node: Node) -> None:
    result = node.prov.reconcile([pol(numVfs=4, mtu=9000)], {})
    vf_mtus = [f"ens1f0v{i} mtu 9000" for i in range(4)]
    assert node.kernel.writes == ["ens1f0 mtu 9000", f"{PF} sriov_numvfs 4", *vf_mtus]
    assert pool(result, "a") == VF[:4]
    assert result.waiting == {} and result.errors == [] and result.rejected == {}
    (record,) = node.records.load().values()
    assert (record.created_vfs, record.original_mtu, record.applied) == (True, 1500, True)
    node.kernel.writes.clear()
    node.prov.reconcile([pol(numVfs=4, mtu=9000)], {})
    assert node.kernel.writes == []  # converged: nothing to write


def test_a_resize_of_free_vfs_applies_at_once(node: Node) -> None:
    node.prov.reconcile([pol(numVfs=2)], {})
    result = node.prov.reconcile([pol(numVfs=5)], {})
    assert result.waiting == {}
    assert pool(result, "a") == VF[:5]


def test_a_resize_under_a_pod_waits_for_it(node: Node) -> None:
    node.prov.reconcile([pol(numVfs=2)], {})
    node.hold(VF[1])
    node.kernel.writes.clear()
    result = node.prov.reconcile([pol(numVfs=5)], {})
    assert node.kernel.writes == []
    assert result.waiting == {VF[1]: {Holder("openshift.io/a", "ns", "p1")}}
    assert pool(result, "a") == VF[:2]  # still the 2 that exist and are configured
    node.kubelet.clear()  # the pod went
    assert pool(node.prov.reconcile([pol(numVfs=5)], {}), "a") == VF[:5]


def test_a_new_partition_and_a_driver_change_of_free_vfs_evict_nothing(node: Node) -> None:
    node.prov.reconcile([pol(numVfs=4)], {})
    node.hold(VF[0])
    net = pol("a", numVfs=4, nicSelector={"pfNames": ["ens1f0#0-1"]}, priority=10)
    dpdk = pol("b", numVfs=4, nicSelector={"pfNames": ["ens1f0#2-3"]}, priority=10,
               deviceType="vfio-pci")  # fmt: skip
    result = node.prov.reconcile([net, dpdk], {})
    assert result.waiting == {}
    assert node.vfs() == {VF[0]: "igbvf", VF[1]: "igbvf", VF[2]: "vfio-pci", VF[3]: "vfio-pci"}
    assert (pool(result, "a"), pool(result, "b")) == (VF[:2], VF[2:4])


def test_a_driver_change_of_a_vf_in_use_waits_for_its_pod_only(node: Node) -> None:
    node.prov.reconcile([pol(numVfs=4)], {})
    node.hold(VF[3], pod="holder")
    dpdk = pol("a", numVfs=4, deviceType="vfio-pci")
    result = node.prov.reconcile([dpdk], {})
    assert result.waiting == {VF[3]: {Holder("openshift.io/a", "ns", "holder")}}
    assert node.vfs()[VF[3]] == "igbvf"
    assert [node.vfs()[v] for v in VF[:3]] == ["vfio-pci"] * 3
    assert pool(result, "a") == VF[:3]


def test_removal_resets_what_plexus_made_and_nothing_else(node: Node, tmp_path: Path) -> None:
    node.prov.reconcile([pol(numVfs=3, mtu=9000)], {})
    result = node.prov.reconcile([], {})
    assert node.vfs() == {}
    (pf,) = [d for d in result.devices if d.address == PF]
    assert pf.mtu == 1500
    assert node.records.load() == {} and result.resources == []
    other = Node(tmp_path / "other")
    other.kernel.set_num_vfs(PF, 2)  # made by someone else; no record
    other.prov.reconcile([], {})
    assert len(other.vfs()) == 2


def test_an_externally_managed_pf_is_bound_and_offered_but_never_reset(node: Node) -> None:
    node.kernel.set_num_vfs(PF, 6)  # e.g. by nmstate
    node.kernel.writes.clear()
    ext = pol(numVfs=4, externallyManaged=True, nicSelector={"pfNames": ["ens1f0#2-3"]},
              deviceType="vfio-pci")  # fmt: skip
    result = node.prov.reconcile([ext], {})
    assert node.kernel.writes == [f"{VF[2]} bind vfio-pci", f"{VF[3]} bind vfio-pci"]
    assert pool(result, "a") == VF[2:4]
    node.prov.reconcile([], {})
    assert len(node.vfs()) == 6
    too_many = pol(numVfs=7, externallyManaged=True)
    assert node.prov.reconcile([too_many], {}).rejected == {
        "a": "numVfs(7) is higher than the VFs created externally on ens1f0 (6)"
    }


def test_drift_is_restored_when_free_and_only_reported_in_use(node: Node) -> None:
    node.prov.reconcile([pol(numVfs=2, mtu=9000)], {})
    node.kernel.set_driver(VF[0], "vfio-pci")  # behind Plexus's back
    result = node.prov.reconcile([pol(numVfs=2, mtu=9000)], {})
    assert result.drift == [f"VF {VF[0]} left its driver: bound to netdevice again"]
    assert node.vfs()[VF[0]] == "igbvf"
    assert {d.mtu for d in result.devices if d.is_vf} == {9000}  # its new netdev's too
    node.kernel.set_driver(VF[1], "vfio-pci")
    node.hold(VF[1])
    result = node.prov.reconcile([pol(numVfs=2, mtu=9000)], {})
    assert result.drift == [f"VF {VF[1]} left its driver while held by pod ns/p1: not restored"]
    assert result.waiting == {}  # nobody is evicted for it
    assert node.vfs()[VF[1]] == "vfio-pci"


def test_what_needs_a_reboot_is_reported_and_not_retried(tmp_path: Path) -> None:
    node = Node(tmp_path, iommu=False)
    dpdk = pol(numVfs=1, deviceType="vfio-pci")
    result = node.prov.reconcile([dpdk], {})
    assert result.reboot == [
        f"binding {VF[0]} to vfio-pci needs an IOMMU, and it has no IOMMU group: boot with "
        "intel_iommu=on iommu=pt (Intel) or iommu=pt (AMD) (and enable VT-d/AMD-Vi in the "
        "firmware) (needs a reboot with intel_iommu=on iommu=pt (Intel) or iommu=pt (AMD))"
    ]
    assert result.resources == []  # the VF is not what the policy asks: not offered
    node.kernel.writes.clear()
    assert node.prov.reconcile([dpdk], {}).reboot == result.reboot
    assert node.kernel.writes == []


def test_boot_applies_the_records_before_any_api(node: Node) -> None:
    node.prov.reconcile([pol(numVfs=3, mtu=9000)], {})
    node.kernel.set_num_vfs(PF, 0)  # a reboot: the kernel forgot the VFs
    result = node.prov.boot()
    assert pool(result, "a") == VF[:3]
    assert {d.mtu for d in result.devices if d.is_vf} == {9000}


def test_a_vf_in_a_pods_namespace_is_held_even_if_no_kubelet_says_by_whom(node: Node) -> None:
    node.prov.reconcile([pol(numVfs=2)], {})
    moved = node.kernel.sysfs.dev_dir(VF[0]) / "net"
    for netdev in moved.iterdir():  # as when a CNI plugin moved it into a pod
        for f in netdev.iterdir():
            f.unlink()
        netdev.rmdir()
    result = node.prov.reconcile([pol(numVfs=3)], {})
    assert result.waiting == {VF[0]: {Holder()}}
    node.hold(VF[0])  # the kubelet names the pod: the kernel's guess gives way
    result = node.prov.reconcile([pol(numVfs=3)], {})
    assert result.waiting == {VF[0]: {Holder("openshift.io/a", "ns", "p1")}}

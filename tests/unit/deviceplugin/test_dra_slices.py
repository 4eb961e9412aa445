"""ResourceSlices built from the device plugin's pools (deviceplugin/dra/slices.py) and the
generations the publisher gives them (deviceplugin/dra/publish.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from deviceplugin.dra.publish import SlicePublisher
from deviceplugin.dra.slices import (
    MAX_DEVICES,
    device_name,
    node_slices,
    pool_name,
    pool_slices,
    slice_name,
)
from deviceplugin.sysfs import PciNetDevice, discover
from tests.unit.deviceplugin.fake_sysfs import FakeSysfs

RESOURCE = "intel.com/sriov_net_A"


def vfs(fake_sysfs: FakeSysfs, count: int = 2) -> list[PciNetDevice]:
    fake_sysfs.add_pf("0000:03:00.0", "ens1f0", numa_node=1)
    for i in range(count):
        fake_sysfs.add_vf("0000:03:00.0", i, f"0000:03:10.{i}", netdev=f"ens1f0v{i}", numa_node=1)
    return [d for d in discover(fake_sysfs.root) if d.is_vf]


def test_names_are_dns_labels_and_subdomains() -> None:
    assert device_name("0000:03:10.1") == "vf-0000-03-10-1"
    assert pool_name("node-a", RESOURCE) == "node-a/intel.com/sriov-net-a"
    assert slice_name("node-a", RESOURCE, 2) == "node-a-intel.com-sriov-net-a-2"


def test_one_device_per_vf_with_the_contract_attributes(fake_sysfs: FakeSysfs) -> None:
    (slice_,) = pool_slices("node-a", "uid-1", RESOURCE, vfs(fake_sysfs), generation=3)
    assert slice_["apiVersion"] == "resource.k8s.io/v1" and slice_["kind"] == "ResourceSlice"
    assert slice_["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": "uid-1", "controller": True}
    ]
    spec = slice_["spec"]
    assert spec["driver"] == "sriov.plexus.io" and spec["nodeName"] == "node-a"
    assert spec["pool"] == {
        "name": "node-a/intel.com/sriov-net-a",
        "generation": 3,
        "resourceSliceCount": 1,
    }
    first, second = spec["devices"]
    assert (first["name"], second["name"]) == ("vf-0000-03-10-0", "vf-0000-03-10-1")
    assert second["attributes"] == {
        "k8s.cni.cncf.io/resourceName": {"string": RESOURCE},
        "k8s.cni.cncf.io/deviceID": {"string": "0000:03:10.1"},
        "pciAddress": {"string": "0000:03:10.1"},
        "pfName": {"string": "ens1f0"},
        "vendor": {"string": "8086"},
        "device": {"string": "154c"},
        "driver": {"string": "iavf"},
        "numaNode": {"int": 1},
        "linkType": {"string": "ether"},
        "pcieRoot": {"string": "pci0000:00"},
        "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
    }


def test_a_big_pool_spans_slices_and_an_empty_pool_has_one_empty_slice(
    fake_sysfs: FakeSysfs,
) -> None:
    (vf,) = vfs(fake_sysfs, 1)
    many = [dataclasses.replace(vf, address=f"0000:04:{i // 8:02x}.{i % 8}") for i in range(130)]
    slices = pool_slices("n", "u", RESOURCE, many, 1)
    assert [len(s["spec"]["devices"]) for s in slices] == [MAX_DEVICES, 2]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {2}
    assert len({s["metadata"]["name"] for s in slices}) == 2
    (empty,) = pool_slices("n", "u", RESOURCE, [], 1)
    assert empty["spec"]["devices"] == []


def _in_api(slices: dict[str, Any], generation: int) -> dict[str, Any]:
    """The slices as the API would hand them back, at `generation`."""
    out = {}
    for name, s in slices.items():
        copy = {**s, "spec": {**s["spec"], "pool": {**s["spec"]["pool"]}}}
        copy["spec"]["pool"]["generation"] = generation
        out[name] = copy
    return out


def test_only_changed_pools_are_written_at_a_higher_generation(fake_sysfs: FakeSysfs) -> None:
    devices = vfs(fake_sysfs)
    pools = {RESOURCE: devices, "intel.com/other": []}
    wanted = node_slices("n", "u", pools, {})
    assert SlicePublisher._generations(wanted, {}) == {
        "n/intel.com/sriov-net-a": 1,
        "n/intel.com/other": 1,
    }
    current = _in_api(wanted, 4)
    assert SlicePublisher._generations(wanted, current) == {}
    shrunk = node_slices("n", "u", {**pools, RESOURCE: devices[:1]}, {})
    assert SlicePublisher._generations(shrunk, current) == {"n/intel.com/sriov-net-a": 5}
    # A new node UID (the Node was re-created) makes the owner stale: written again.
    moved = node_slices("n", "u2", pools, {})
    assert set(SlicePublisher._generations(moved, current)) == {
        "n/intel.com/sriov-net-a",
        "n/intel.com/other",
    }

"""The SR-IOV device plugin's DaemonSet on the two real nodes: registered with each kubelet.

crds/plexus-deviceplugin.yaml is applied as shipped (its config.json too) through the
documented overlay, which changes only the image and host paths. The host kernel has no
SR-IOV, so each node gets a FAKE sysfs (tests/unit/deviceplugin/fake_sysfs.py): one PF
with VFs of the vendor and driver the shipped config.json selects, a different count per
node, so each Node's allocatable proves its own plugin read its own tree. The overlay
moves the DaemonSet's `/sys` there, into the node's own /run (tests/cluster/mounts.py),
and its DRA-only host dirs beside it (unused without `--dra-resources`), so nothing lands
on the host's own paths.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

from tests.cluster import install
from tests.cluster.apiserver import REPO
from tests.cluster.kubelet import run_all
from tests.cluster.twonodes import TwoNodes
from tests.unit.deviceplugin.fake_sysfs import FakeSysfs

# Alone, this test also pays for the session's nodes and Plexus install.
pytestmark = pytest.mark.timeout(900)

MANIFEST = REPO / "crds" / "plexus-deviceplugin.yaml"
NAME = "plexus-deviceplugin"  # its DaemonSet
SRIOV_LABEL = "feature.node.kubernetes.io/network-sriov.capable"  # the DaemonSet's nodeSelector
RESOURCE = "intel.com/sriov_netdevice"  # the shipped config.json's netdevice resource
PF = "0000:3b:00.0"
VF_COUNTS = (2, 3)  # per node
# The DaemonSet's host dirs the test moves into the node's own /run: the sysfs, and those
# only its DRA kubelet plugin uses.
MOVED = {
    "/sys": "fake-sys",
    "/var/lib/kubelet/plugins_registry": "plugins_registry",
    "/var/lib/kubelet/plugins": "kubelet-plugins",
    "/var/lib/plexus/dra": "dra-state",
    "/var/lib/plexus/sriov": "sriov-state",  # provisioning's records
}


def make_fake_sysfs(root: Path, vfs: int) -> None:
    """A FAKE sysfs at `root`: one PF (i40e) with `vfs` iavf VFs, Intel's vendor ID."""
    sysfs = FakeSysfs(root)
    sysfs.add_pf(PF, "fakepf0")
    for index in range(vfs):
        sysfs.add_vf(PF, index, f"0000:3b:02.{index}", netdev=f"fakepf0v{index}")


def test_the_device_plugin_daemonset_registers_with_each_kubelet(two_nodes: TwoNodes) -> None:
    tn = two_nodes
    if not tn.image:
        pytest.skip("Plexus is started by hand here: this tree cannot build its image")
    tag = f"pxt-dp-{uuid.uuid4().hex[:8]}"  # under each node's own /run
    for kn, vfs in zip(tn.nodes, VF_COUNTS, strict=True):
        make_fake_sysfs(kn.run_dir / tag / MOVED["/sys"], vfs)
    objects = install.manifests(
        tn.image, [MANIFEST], {old: f"/run/{tag}/{new}" for old, new in MOVED.items()}
    )
    try:
        for kn in tn.nodes:
            tn.cluster.merge_patch(
                f"/api/v1/nodes/{kn.name}", {"metadata": {"labels": {SRIOV_LABEL: "true"}}}
            )
        for obj in objects:
            tn.cluster.apply(obj)
        try:
            # A pod from the image on each node, then each kubelet's count of its VFs.
            install.wait_daemonset(tn.cluster, tn.nodes, tn.image, NAME)
            for kn, vfs in zip(tn.nodes, VF_COUNTS, strict=True):
                kn.wait_allocatable(RESOURCE, str(vfs))
        except AssertionError as err:
            raise AssertionError(f"{err}\n{tn.dump()}") from None
    finally:
        run_all(
            [
                lambda: install.delete_daemonset(tn.cluster, NAME),
                *(
                    lambda obj=obj: install.delete(tn.cluster, tn.cluster.object_path(obj))
                    for obj in reversed(objects)
                ),
                *(
                    lambda kn=kn: tn.cluster.merge_patch(
                        f"/api/v1/nodes/{kn.name}", {"metadata": {"labels": {SRIOV_LABEL: None}}}
                    )
                    for kn in tn.nodes
                ),
                *(lambda kn=kn: shutil.rmtree(kn.run_dir / tag) for kn in tn.nodes),
            ]
        )

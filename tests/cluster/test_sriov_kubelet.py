"""Provisioning on a node with a real kubelet: the agent's pools served by the in-process device
plugin registered with that kubelet, pods given VFs by it, and a change that touches one
pod's VF evicting exactly that pod, which the kubelet then stops, found through the
kubelet's PodResources API (meta/podresources), as `plexus deviceplugin --provision` runs.

The host has no SR-IOV: the VFs come from a FAKE kernel (tests/unit/deviceplugin/
fake_kernel.py); everything else (API server, kubelet, containerd, pods) is real.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from deviceplugin.config import DevicePluginConfig, ResourceConfig
from deviceplugin.plugin import DevicePluginRunner, PluginOptions
from deviceplugin.provision.agent import ProvisionAgent, ProvisionOptions
from deviceplugin.provision.holders import AllocationReader
from deviceplugin.provision.node import NodeProvisioner
from deviceplugin.provision.record import Records
from deviceplugin.server import HostPaths
from kube.api import KubeAPI
from meta.podresources.client import PodResourcesClient
from tests.cluster import sriov
from tests.cluster.kubelet import KubeletNode
from tests.runtime.image import NAME as PAUSE_IMAGE
from tests.unit.deviceplugin.fake_kernel import FakeKernel, vf_address
from tests.unit.deviceplugin.fake_sysfs import FakeSysfs
from tests.wait import wait_for

pytestmark = pytest.mark.timeout(600)  # alone, it also pays for the kubelet node

RESOURCE = "openshift.io/kubenet"
VF = [vf_address(sriov.PF, i) for i in range(2)]

Json = dict[str, Any]


@pytest.fixture
def provisioned(
    kubelet_node: KubeletNode, tmp_path: Path
) -> Iterator[tuple[ProvisionAgent, DevicePluginRunner, str]]:
    """The agent on the kubelet's node (labelled for this test's policies) with a FAKE kernel,
    feeding a device plugin registered with that kubelet; yields (agent, runner, tag)."""
    kn, tag = kubelet_node, uuid.uuid4().hex[:6]
    cluster = kn.cluster
    sriov.install(cluster)
    label = {"metadata": {"labels": {"pxt-sriov": tag}}}
    cluster.merge_patch(f"/api/v1/nodes/{kn.name}", label)
    kernel = FakeKernel(FakeSysfs(tmp_path / "sys"))
    kernel.add_pf(sriov.PF, "ens1f0")
    runner = DevicePluginRunner(
        DevicePluginConfig(resource_list=[]),
        PluginOptions(
            paths=HostPaths(str(kernel.root), "/dev", str(kn.devinfo_dir)),
            plugins_dir=kn.kubelet.device_plugins_dir,
        ),
    )

    def publish(resources: list[ResourceConfig]) -> None:
        runner.set_config(DevicePluginConfig(resource_list=resources))

    kubelet = PodResourcesClient(str(kn.kubelet.pod_resources_socket)).allocations
    provisioner = NodeProvisioner(
        kernel, Records(tmp_path / "records"), AllocationReader(kubelet, None)
    )
    options = ProvisionOptions(node_name=kn.name, retry_seconds=0.5, render_networks=False)
    api = KubeAPI(str(sriov.service_account_kubeconfig(cluster, tmp_path / "kubeconfig")))
    agent = ProvisionAgent(api, options, provisioner, publish)
    serving = threading.Thread(target=runner.run)
    serving.start()
    try:
        yield agent, runner, tag
    finally:
        agent.stop()
        runner.stop()
        serving.join(timeout=30)
        cluster.merge_patch(
            f"/api/v1/nodes/{kn.name}", {"metadata": {"labels": {"pxt-sriov": None}}}
        )
        for obj in cluster.get(sriov.POLICIES)["items"]:
            if obj["metadata"]["name"].endswith(tag):
                cluster.request("DELETE", f"{sriov.POLICIES}/{obj['metadata']['name']}")


def vf_pod(kn: KubeletNode, name: str) -> Json:
    limits = {RESOURCE: "1"}
    container = {"name": "app", "image": PAUSE_IMAGE, "imagePullPolicy": "Never",
                 "resources": {"limits": limits, "requests": limits}}  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"nodeName": kn.name, "containers": [container],
                 "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 2},
    }  # fmt: skip


def test_a_change_under_one_pods_vf_evicts_that_pod_and_the_kubelet_frees_it(
    kubelet_node: KubeletNode,
    provisioned: tuple[ProvisionAgent, DevicePluginRunner, str],
    namespace: str,
) -> None:
    kn, (agent, _, tag) = kubelet_node, provisioned
    cluster = kn.cluster
    base = {"resourceName": "kubenet", "nodeSelector": {"pxt-sriov": tag}, "numVfs": 2}
    cluster.apply(sriov.policy(f"net-{tag}", **base, nicSelector={"pfNames": ["ens1f0"]}))
    agent.run_pass()
    kn.wait_allocatable(RESOURCE, "2")
    for name in ("p0", "p1"):
        kn.run_pod(namespace, vf_pod(kn, name))
    client = PodResourcesClient(str(kn.kubelet.pod_resources_socket))
    held = {a.device_ids[0]: a.name for a in client.allocations() if a.resource == RESOURCE}
    assert sorted(held) == VF, held

    # VF 1 goes to vfio-pci: its pod, and only it, must go first.
    part = {**base, "priority": 5}
    cluster.apply(sriov.policy(f"net-{tag}", **part, nicSelector={"pfNames": ["ens1f0#0-0"]}))
    cluster.apply(
        sriov.policy(
            f"dpdk-{tag}",
            **{**part, "resourceName": "kubedpdk"},
            deviceType="vfio-pci",
            nicSelector={"pfNames": ["ens1f0#1-1"]},
        )
    )
    result = agent.run_pass()
    assert set(result.waiting) == {VF[1]}
    gone, kept = held[VF[1]], held[VF[0]]
    wait_for(lambda: kn.get_pod(namespace, gone) is None, f"pod {gone} evicted and stopped", 90)
    assert kn.get_pod(namespace, kept)["status"]["phase"] == "Running"  # type: ignore[index]

    def applied() -> bool:
        return not agent.run_pass().waiting

    wait_for(applied, "the change applied once the kubelet freed the VF", 60)
    assert agent.state.node == kn.name
    status = cluster.get(f"{sriov.STATES}/{kn.name}")["status"]
    assert status["syncStatus"] == "Succeeded"
    (pf,) = status["interfaces"]
    assert [(v["pciAddress"], v["driver"], v.get("assigned", "")) for v in pf["Vfs"]] == [
        (VF[0], "igbvf", f"{namespace}/{kept}"),
        (VF[1], "vfio-pci", ""),
    ]

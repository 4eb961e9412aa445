"""Plexus's DaemonSet on two real nodes: upgraded and killed under load, then uninstalled.

Only where Plexus runs from its image (tests/cluster/install.py). Pods are created in a
burst while the daemon on a node is being replaced; each must end up Running with eth0
and net1 (a failed ADD is retried by the kubelet), never with eth0 alone, and deleting
them must release every address and record. Uninstalling (the DaemonSet deleted, then
`plexus uninstall-cni` on each node) leaves each node with its primary network only.
"""

from __future__ import annotations

import os
import signal
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from meta.daemon.cniconfig import NETWORK_NAME
from tests.cluster import install
from tests.cluster.kubelet import KubeletNode, create_nad
from tests.cluster.twonodes import LAN_SUBNET, PodOnNode, TwoNodes, check_networks
from tests.netns.daemon import PLEXUS
from tests.runtime.conftest import addresses

pytestmark = pytest.mark.timeout(900)  # may pay for the session's nodes and install
UPGRADE_PODS = 20  # at least this many pods created during the upgrade
NEXT_IMAGE = "localhost/plexus:next"


@pytest.fixture
def plexus_image(two_nodes: TwoNodes) -> TwoNodes:
    if not two_nodes.image:
        pytest.skip("Plexus is started by hand here: this tree cannot build its image")
    return two_nodes


def create(tn: TwoNodes, namespace: str, names: list[str], nodes: list[KubeletNode]) -> None:
    path = f"/api/v1/namespaces/{namespace}/pods"
    for name, kn in zip(names, nodes, strict=True):
        tn.cluster.create(path, kn.pod_manifest(name, "lan-net"))


def settle(tn: TwoNodes, namespace: str, names: list[str], nodes: list[KubeletNode]) -> None:
    """Every pod Running with all its networks; then all deleted, nothing left behind."""
    pods = [PodOnNode(kn, namespace, name) for name, kn in zip(names, nodes, strict=True)]
    for pod in pods:
        check_networks(pod, namespace)
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda pod: pod.kn.delete_pod(namespace, pod.name), pods))
    for kn in tn.nodes:
        assert not {pod.sandbox_id for pod in pods} & kn.records()
    assert tn.reserved_ips() == []


def test_rolling_upgrade_while_pods_are_created(plexus_image: TwoNodes, namespace: str) -> None:
    tn = plexus_image
    create_nad(tn.cluster, namespace, "lan-net", tn.macvlan_conf(LAN_SUBNET))
    create(tn, namespace, ["before0", "before1"], tn.nodes)
    running = [PodOnNode(kn, namespace, f"before{i}") for i, kn in enumerate(tn.nodes)]
    archive = install.build_image(NEXT_IMAGE)  # the same tree: only another tag
    with ThreadPoolExecutor(len(tn.nodes)) as pool:
        jobs = [pool.submit(install.import_image, kn, archive, NEXT_IMAGE) for kn in tn.nodes]
        for job in jobs:
            job.result()
    old_daemons = {
        node: pod["metadata"]["uid"] for node, pod in install.daemon_pods(tn.cluster).items()
    }

    install.set_image(tn.cluster, NEXT_IMAGE)
    tn.image = NEXT_IMAGE
    names: list[str] = []
    nodes: list[KubeletNode] = []
    done_before = 0  # pods created before the rollout was seen complete
    while len(names) < UPGRADE_PODS or not install.daemonset_ready(tn.cluster, 2, NEXT_IMAGE):
        batch = [f"during{len(names) + i}" for i in range(2)]
        create(tn, namespace, batch, tn.nodes)
        names += batch
        nodes += tn.nodes
        if not install.daemonset_ready(tn.cluster, 2, NEXT_IMAGE):
            done_before = len(names)
    print(f"upgrade: {done_before} pods created before the rollout completed, {len(names)} in all")
    install.wait_daemonset(tn.cluster, tn.nodes, NEXT_IMAGE)
    new_daemons = install.daemon_pods(tn.cluster)
    assert all(new_daemons[n]["metadata"]["uid"] != uid for n, uid in old_daemons.items())

    for pod in running:  # running pods kept their interfaces
        assert addresses(pod.netns) == pod.links
    settle(tn, namespace, names, nodes)
    for pod in running:
        pod.kn.delete_pod(namespace, pod.name)
    assert tn.reserved_ips() == []


def test_daemon_killed_and_restarted_by_the_kubelet(plexus_image: TwoNodes, namespace: str) -> None:
    tn = plexus_image
    create_nad(tn.cluster, namespace, "lan-net", tn.macvlan_conf(LAN_SUBNET))
    kn = tn.nodes[0]
    daemon = install.daemon_pods(tn.cluster)[kn.name]
    os.kill(install.daemon_pid(kn), signal.SIGKILL)
    names = [f"killed{i}" for i in range(10)]
    create(tn, namespace, names, [kn] * len(names))
    settle(tn, namespace, names, [kn] * len(names))
    install.wait_daemonset(tn.cluster, tn.nodes, tn.image)
    # The kubelet restarted the daemon's container in the same pod.
    restarted = install.daemon_pods(tn.cluster)[kn.name]
    assert restarted["metadata"]["uid"] == daemon["metadata"]["uid"]
    (status,) = restarted["status"]["containerStatuses"]
    assert status["restartCount"] >= 1, status


def test_uninstall_leaves_the_primary_network_only(plexus_image: TwoNodes, namespace: str) -> None:
    tn = plexus_image
    create_nad(tn.cluster, namespace, "lan-net", tn.macvlan_conf(LAN_SUBNET))
    install.delete_daemonset(tn.cluster)
    try:
        for kn in tn.nodes:
            done = subprocess.run(
                [*kn.mounts.nsenter(), PLEXUS, "uninstall-cni"], capture_output=True, text=True
            )
            assert done.returncode == 0, done.stderr
            assert sorted(p.name for p in kn.net_dir.iterdir()) == ["10-default.conflist"]
            assert not [p.name for p in kn.node.bin.iterdir() if p.name.startswith("plexus")]
            assert not kn.cni_state.exists()
            assert not (kn.run_dir / "plexus").exists()
            kn.wait_cni_network("default-net")
        # A pod asking for the NAD now gets the node's primary network and nothing else.
        kn = tn.nodes[0]
        create(tn, namespace, ["after"], [kn])
        uid = kn.wait_running(namespace, "after")["metadata"]["uid"]
        (sandbox,) = kn.sandboxes(uid, ready_only=True)
        assert sorted(addresses(kn.sandbox_netns(sandbox.id))) == ["eth0", "lo"]
        kn.delete_pod(namespace, "after")
    finally:  # Plexus back on the nodes for whatever runs next in the session
        install.apply(tn.cluster, tn.image)
        install.wait_daemonset(tn.cluster, tn.nodes, tn.image)
        for kn in tn.nodes:
            kn.wait_cni_network(NETWORK_NAME)

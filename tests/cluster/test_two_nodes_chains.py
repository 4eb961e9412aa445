"""Chained plugins on a mixed cluster (containerd 2.x and Debian's 1.6), Plexus installed
from crds/: the tuning plugin's sysctls on eth0, the user story, on both nodes alike.

`<net.d>/default-net/` chains onto the cluster network Plexus wraps: the daemon runs that
chain itself. `<net.d>/plexus-cni-network/` chains onto Plexus's own network: the daemon
inlines it after plexus in the conflist it generates, so containerd 1.6 (whose libcni
never reads that directory) runs it like 2.x. Each change rewrites the conflist, which is
what makes containerd 2.x reload it. DEL runs the chain the ADD ran.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cni.fileio import write_atomic
from meta.daemon.config import GENERATED_NAME, NETWORK_NAME
from tests.cluster.kubelet import KubeletNode, create_nad
from tests.cluster.twonodes import LAN_SUBNET, PodOnNode, TwoNodes, check_networks
from tests.runtime import containerd as ctrd
from tests.runtime.conftest import in_netns

pytestmark = pytest.mark.timeout(900)

# The cluster network's chain and Plexus's own, each setting one sysctl of eth0.
CHAINS = {
    "default-net": ("net.ipv4.conf.eth0.arp_filter", "1"),
    NETWORK_NAME: ("net.ipv4.conf.eth0.arp_announce", "2"),
}


def _generated(kn: KubeletNode) -> tuple[list[str], list[str]]:
    """The generated conflist's plugin types and its primary's (the delegate's)."""
    conf = json.loads((kn.net_dir / GENERATED_NAME).read_text())
    (primary,) = conf["plugins"][0]["delegates"]
    return [p["type"] for p in conf["plugins"]], [p["type"] for p in primary["plugins"]]


def _loaded(kn: KubeletNode) -> str:
    """The source of Plexus's network as the node's containerd loaded it."""
    return str(kn.containerd.cni_network(NETWORK_NAME).get("Source", ""))


def _wait_chains(kn: KubeletNode, plugins: list[str], primary: list[str]) -> None:
    """Until the daemon generated the chains and the node's containerd runs them."""
    kn.wait_for(
        f"{GENERATED_NAME} with plugins {plugins}, primary {primary}",
        lambda: _generated(kn) == (plugins, primary),
    )
    kn.wait_for(
        f"{kn.containerd.release.name} to load {GENERATED_NAME}",
        lambda: _loaded(kn) == (kn.net_dir / GENERATED_NAME).read_text(),
    )


def _sysctl(pod: PodOnNode, key: str) -> str:
    return in_netns(pod.netns, "sysctl", "-n", key).strip()


def test_chains_run_on_both_nodes_of_a_mixed_cluster(two_nodes: TwoNodes, namespace: str) -> None:
    tn = two_nodes
    assert [kn.containerd.release for kn in tn.nodes] == [ctrd.BUILT, ctrd.DEBIAN]
    create_nad(tn.cluster, namespace, "lan-net", tn.macvlan_conf(LAN_SUBNET))
    dirs: list[Path] = []
    try:
        for kn in tn.nodes:
            for network, (key, value) in CHAINS.items():
                directory = kn.net_dir / network
                directory.mkdir()
                dirs.append(directory)
                plugin = {"type": "tuning", "sysctl": {key: value}}
                write_atomic(directory / "50-tuning.conf", json.dumps(plugin).encode(), 0o644)
        for kn in tn.nodes:
            _wait_chains(kn, ["plexus", "tuning"], ["bridge", "tuning"])

        for i, kn in enumerate(tn.nodes):
            tn.cluster.create(
                f"/api/v1/namespaces/{namespace}/pods", kn.pod_manifest(f"tuned{i}", "lan-net")
            )
        pods = [PodOnNode(kn, namespace, f"tuned{i}") for i, kn in enumerate(tn.nodes)]
        for pod in pods:
            check_networks(pod, namespace)
            for key, value in CHAINS.values():
                assert _sysctl(pod, key) == value, (pod.kn.containerd.release.name, key)
            (delegate,) = [d for d in pod.kn.record(pod.sandbox_id)["delegates"] if d["default"]]
            assert [p["type"] for p in delegate["config"]["plugins"]] == ["bridge", "tuning"]
    finally:
        for directory in dirs:
            shutil.rmtree(directory)
    for kn in tn.nodes:
        _wait_chains(kn, ["plexus"], ["bridge"])

    # DEL after the chains are gone: Plexus's record still holds the primary's.
    for pod in pods:
        pod.kn.delete_pod(namespace, pod.name)
        assert pod.sandbox_id not in pod.kn.records()
    assert tn.reserved_ips() == []

"""Plexus across two real nodes: pods on both get their NAD's macvlan and reach each other.

The nodes are tests/cluster/twonodes.py's: one control plane with its controllers, two
kubelets on their own containerd in their own node namespaces, their uplinks joined by a
bridge in a namespace of the test's. Everything is real; the pods' traffic stays in there.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.cluster.kubelet import NETWORKS, Json, create_nad
from tests.cluster.twonodes import LAN_SUBNET, PodOnNode, TwoNodes, check_networks
from tests.runtime.conftest import in_netns
from tests.runtime.image import NAME as PAUSE_IMAGE

# The first test also pays for the session's nodes and Plexus install (a cold image
# build takes minutes).
pytestmark = pytest.mark.timeout(900)


def neighbour_mac(netns: str, ifname: str, ip: str) -> str:
    entries: list[dict[str, Any]] = json.loads(
        in_netns(netns, "ip", "-j", "neigh", "show", ip, "dev", ifname)
    )
    return str(entries[0].get("lladdr", "")) if entries else ""


def check_ping_across(tn: TwoNodes, first: PodOnNode, second: PodOnNode) -> None:
    """Node 1's pod reaches node 2's over net1: two uplinks' macvlans and the LAN."""
    assert tn.lan is not None
    peer = second.ip("net1")
    in_netns(first.netns, "ping", "-c", "3", "-i", "0.2", "-w", "30", "-I", "net1", peer)
    assert neighbour_mac(first.netns, "net1", peer) == second.links["net1"]["mac"]
    learned = tn.lan.learned()  # the LAN's bridge saw each pod's frames on its node's port
    assert learned.get(first.links["net1"]["mac"]) == "port0", learned
    assert learned.get(second.links["net1"]["mac"]) == "port1", learned


def test_pods_on_two_nodes_get_the_macvlan_and_ping_across(
    two_nodes: TwoNodes, namespace: str
) -> None:
    tn = two_nodes
    create_nad(tn.cluster, namespace, "lan-net", tn.macvlan_conf(LAN_SUBNET))
    records_before = [kn.records() for kn in tn.nodes]

    for i, kn in enumerate(tn.nodes):
        kn.cluster.create(
            f"/api/v1/namespaces/{namespace}/pods", kn.pod_manifest(f"pod{i}", "lan-net")
        )
    pods = [PodOnNode(kn, namespace, f"pod{i}") for i, kn in enumerate(tn.nodes)]
    for pod in pods:
        check_networks(pod, namespace)
    first, second = pods
    assert sorted(tn.reserved_ips()) == sorted([first.ip("net1"), second.ip("net1")])
    check_ping_across(tn, first, second)

    for pod in pods:
        pod.kn.delete_pod(namespace, pod.name)
        assert pod.kn.sandboxes(pod.uid, ready_only=True) == []
    assert [kn.records() for kn in tn.nodes] == records_before
    assert tn.reserved_ips() == []


def daemonset(name: str, networks: str) -> Json:
    """A DaemonSet of the pause image with a networks annotation; pods keep the default
    service-account token (a projected volume: token controller, kube-root-ca.crt)."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": {NETWORKS: networks}},
                "spec": {
                    "containers": [
                        {"name": "app", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}
                    ],
                    "enableServiceLinks": False,
                    "terminationGracePeriodSeconds": 5,
                },
            },
        },
    }


def test_a_daemonset_runs_a_networked_pod_on_each_node(two_nodes: TwoNodes, namespace: str) -> None:
    tn = two_nodes
    create_nad(tn.cluster, namespace, "lan-net", tn.macvlan_conf(LAN_SUBNET))
    apps = f"/apis/apps/v1/namespaces/{namespace}/daemonsets"
    tn.cluster.create(apps, daemonset("spread", "lan-net"))

    # The DaemonSet controller made one pod per node, the scheduler bound each.
    by_node = {kn.name: kn for kn in tn.nodes}
    placed: dict[str, str] = {}

    def both_placed() -> bool:
        items = tn.cluster.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
        placed.clear()
        placed.update({p["spec"].get("nodeName", ""): p["metadata"]["name"] for p in items})
        return len(items) == 2 and set(placed) == set(by_node)

    scheduler_log = tn.cluster.logs["kube-scheduler"]
    tn.nodes[0].wait_for("a pod of the DaemonSet on each node", both_placed, scheduler_log)
    pods = [PodOnNode(kn, namespace, placed[kn.name]) for kn in tn.nodes]
    for pod in pods:
        check_networks(pod, namespace)
        spec = tn.cluster.get(f"/api/v1/namespaces/{namespace}/pods/{pod.name}")["spec"]
        assert any("projected" in volume for volume in spec["volumes"]), spec["volumes"]
    check_ping_across(tn, *pods)

    # Deleting the DaemonSet: the garbage collector deletes its pods, Plexus releases all.
    tn.cluster.request("DELETE", f"{apps}/spread", {"propagationPolicy": "Background"})
    for pod in pods:
        pod.kn.wait_pod(namespace, pod.name, lambda p: p is None, "gone from the API")
        assert pod.sandbox_id not in pod.kn.records()
    assert tn.reserved_ips() == []

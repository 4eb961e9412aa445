"""The SR-IOV provisioning agent (deviceplugin/provision/agent.py) against the real
kube-apiserver, with the CRDs from crds/ and the device plugin ServiceAccount's rights from
crds/plexus-sriov-provisioning.yaml: policies -> VFs, pools, the node state and Events;
SriovNetworks -> NADs; which pods a change evicts (the Eviction API, PDBs holding); two nodes
of a pool with maxUnavailable 1 never disrupting together.

The host has no SR-IOV: each node's VFs come from a FAKE kernel (tests/unit/deviceplugin/
fake_kernel.py; the real writes are tested in the VM), and with no kubelet on these nodes a
FAKE device manager says which pod holds which VF (tests/cluster/sriov.py). The eviction of
pods a real kubelet allocated VFs to is tests/cluster/test_sriov_kubelet.py.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import deviceplugin.provision.agent as agent_module
from deviceplugin.provision.evict import evict as evict_pod
from deviceplugin.provision.leases import LeaseSlots
from tests.cluster import sriov
from tests.cluster.apiserver import REPO, ApiError, Cluster
from tests.cluster.sriov import NAMESPACE, AgentNode, run_pod
from tests.docs import blocks
from tests.unit.deviceplugin.fake_kernel import vf_address
from tests.wait import wait_for

VF = [vf_address(sriov.PF, i) for i in range(7)]
RESOURCE = "openshift.io/{}"

Json = dict[str, Any]


@pytest.fixture(scope="module")
def crds(cluster: Cluster) -> Cluster:
    sriov.install(cluster)
    return cluster


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex[:6]


@pytest.fixture
def nodes(crds: Cluster, tmp_path: Path, tag: str) -> Iterator[Callable[..., AgentNode]]:
    """A factory of agent nodes labelled `pxt-sriov=<tag>`; all removed afterwards, with the
    test's policies, pool configs and pods."""
    made: list[AgentNode] = []

    def make(index: int = 0, **labels: str) -> AgentNode:
        name = f"pxt-sriov-{tag}-{index}"
        node = AgentNode(crds, tmp_path / name, name, {"pxt-sriov": tag, **labels})
        made.append(node)
        return node

    yield make
    for node in made:
        node.close()
    for path in (sriov.POLICIES, sriov.POOLS):
        for obj in crds.get(path)["items"]:
            if obj["metadata"]["name"].endswith(tag):
                crds.request("DELETE", f"{path}/{obj['metadata']['name']}")


def policy(tag: str, name: str, **spec: Any) -> Json:
    body = {"resourceName": name, "nodeSelector": {"pxt-sriov": tag}, "numVfs": 4,
            "nicSelector": {"pfNames": ["ens1f0"]}}  # fmt: skip
    return sriov.policy(f"{name}-{tag}", **{**body, **spec})


def events(cluster: Cluster, node: str) -> list[tuple[str, str, str]]:
    found = cluster.get(
        f"/api/v1/namespaces/{NAMESPACE}/events",
        query={"fieldSelector": f"involvedObject.name={node}"},
    )["items"]
    return [(e["type"], e["reason"], e["message"]) for e in found]


def test_a_policy_makes_vfs_a_pool_the_node_state_and_events(
    crds: Cluster, nodes: Callable[..., AgentNode], tag: str
) -> None:
    node = nodes()
    crds.apply(policy(tag, "net", numVfs=3, mtu=9000))
    result = node.agent.run_pass()
    assert result.waiting == {} and result.errors == []
    assert node.pool(RESOURCE.format("net")) == VF[:3]
    state = node.state()
    assert state["spec"]["interfaces"] == [
        {
            "pciAddress": sriov.PF, "numVfs": 3, "name": "ens1f0", "mtu": 9000,
            "vfGroups": [{"resourceName": "net", "deviceType": "netdevice", "vfRange": "0-2",
                          "policyName": f"net-{tag}", "mtu": 9000}],
        }
    ]  # fmt: skip
    status = state["status"]
    assert status["syncStatus"] == "Succeeded" and "lastSyncError" not in status
    (pf,) = status["interfaces"]
    assert (pf["pciAddress"], pf["numVfs"], pf["totalvfs"], pf["mtu"], pf["linkType"]) == (
        sriov.PF,
        3,
        7,
        9000,
        "ETH",
    )
    assert [(v["vfID"], v["pciAddress"], v["driver"], v["mtu"]) for v in pf["Vfs"]] == [
        (i, VF[i], "igbvf", 9000) for i in range(3)
    ]
    assert state["metadata"]["annotations"]["sriovnetwork.openshift.io/desired-state"] == "Idle"
    assert state["metadata"]["ownerReferences"][0]["kind"] == "Node"
    assert ("Normal", "Provisioned") in {(t, r) for t, r, _ in events(crds, node.name)}


def test_what_the_webhook_would_refuse_is_reported_in_the_node_state(
    crds: Cluster, nodes: Callable[..., AgentNode], tag: str
) -> None:
    node = nodes()
    crds.apply(policy(tag, "big", numVfs=8))  # the FAKE PF has 7
    node.agent.run_pass()
    status = node.state()["status"]
    why = f"policy big-{tag}: numVfs(8) exceeds the maximum allowed value(7) of interface ens1f0"
    assert (status["syncStatus"], status["lastSyncError"]) == ("Failed", why)
    assert ("Warning", "PolicyRejected", why) in events(crds, node.name)
    assert node.vfs() == {}


def test_sriov_networks_render_their_nads(
    crds: Cluster, nodes: Callable[..., AgentNode], tag: str
) -> None:
    node = nodes()
    target = f"pxt-{tag}"
    crds.create_namespace(target)
    name = f"net-{tag}"
    crds.apply(sriov.network(name, networkNamespace=target, resourceName="intelnics", vlan=100))
    chained = f"chain-{tag}"
    vrf = '{ "type": "vrf", "vrfname": "blue" }'
    crds.apply(sriov.network(chained, namespace=target, resourceName="intelnics", metaPlugins=vrf))
    wrong = f"wrong-{tag}"
    crds.apply(sriov.network(wrong, namespace=target, resourceName="x", networkNamespace="default"))
    node.agent.run_pass()

    nad = crds.get(f"{sriov.NADS.format(ns=target)}/{name}")
    assert nad["metadata"]["annotations"] == {
        "k8s.v1.cni.cncf.io/resourceName": "openshift.io/intelnics",
        "sriovnetwork.openshift.io/owner-ref": (
            f"SriovNetwork.sriovnetwork.openshift.io/{NAMESPACE}/{name}"
        ),
    }
    assert nad["spec"]["config"] == (
        '{\n    "cniVersion": "1.0.0",\n    "name": "' + name + '",\n    "type": "sriov",\n'
        '    "vlan": 100,\n    "vlanQoS": 0,\n    "logLevel": "info",\n    "ipam": {}\n}'
    )
    config = json.loads(crds.get(f"{sriov.NADS.format(ns=target)}/{chained}")["spec"]["config"])
    assert [p["type"] for p in config["plugins"]] == ["sriov", "vrf"]

    def ready(ns: str, net: str) -> Json:
        conditions = crds.get(f"{sriov.NETWORKS.format(ns=ns)}/{net}")["status"]["conditions"]
        return dict(next(c for c in conditions if c["type"] == "Ready"))

    assert (ready(NAMESPACE, name)["status"], ready(NAMESPACE, name)["reason"]) == (
        "True",
        "NetworkReady",
    )
    refused = ready(target, wrong)
    assert (refused["status"], refused["reason"]) == ("False", "NetworkAttachmentDefinitionInvalid")

    # Deleting the SriovNetwork deletes its NAD in the other namespace (the finalizer's job).
    crds.request("DELETE", f"{sriov.NETWORKS.format(ns=NAMESPACE)}/{name}")
    node.agent.run_pass()
    with pytest.raises(ApiError) as err:
        crds.get(f"{sriov.NADS.format(ns=target)}/{name}")
    assert err.value.status == 404
    for net in (chained, wrong):
        crds.request("DELETE", f"{sriov.NETWORKS.format(ns=target)}/{net}")


def test_a_change_of_free_vfs_evicts_nothing_one_of_vfs_in_use_exactly_their_pods(
    crds: Cluster, nodes: Callable[..., AgentNode], tag: str, namespace: str
) -> None:
    node = nodes()
    crds.apply(sriov.pool_config(f"pool-{tag}", 1, {"pxt-sriov": tag}))
    crds.apply(policy(tag, "net", numVfs=4))
    node.agent.run_pass()
    res = RESOURCE.format("net")
    pods = f"/api/v1/namespaces/{namespace}/pods"
    for name, vfs in (("a", VF[:1]), ("b", VF[1:2]), ("idle", [])):
        run_pod(crds, namespace, name, node.name, {res: vfs} if vfs else {}, {"app": name})

    # VFs 2-3 are free: moving them to vfio-pci (a new partition) evicts nobody.
    crds.apply(policy(tag, "net", numVfs=4, nicSelector={"pfNames": ["ens1f0#0-1"]}, priority=5))
    crds.apply(policy(tag, "dpdk", numVfs=4, nicSelector={"pfNames": ["ens1f0#2-3"]}, priority=5,
                      deviceType="vfio-pci"))  # fmt: skip
    result = node.agent.run_pass()
    assert result.waiting == {}
    assert [node.vfs()[v] for v in VF[:4]] == ["igbvf", "igbvf", "vfio-pci", "vfio-pci"]
    assert all("deletionTimestamp" not in p["metadata"] for p in crds.get(pods)["items"])

    # VF 0 moves to vfio-pci too: only pod `a` holds it. A PDB first keeps `a`.
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "keep-a"},
           "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "a"}}}}  # fmt: skip
    crds.create(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets", pdb)
    crds.apply(policy(tag, "net", numVfs=4, nicSelector={"pfNames": ["ens1f0#1-1"]}, priority=5))
    crds.apply(policy(tag, "dpdk", numVfs=4, nicSelector={"pfNames": ["ens1f0#0-0"]}, priority=5,
                      deviceType="vfio-pci"))  # fmt: skip
    result = node.agent.run_pass()
    assert set(result.waiting) == {VF[0]}
    state = node.state()
    assert state["status"]["syncStatus"] == "InProgress"
    assert "eviction of pod " + f"{namespace}/a refused" in state["status"]["lastSyncError"]
    assert (
        state["metadata"]["annotations"]["sriovnetwork.openshift.io/desired-state"]
        == "Drain_Required"
    )
    assert all("deletionTimestamp" not in p["metadata"] for p in crds.get(pods)["items"])

    crds.request("DELETE", f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/keep-a")
    node.agent.run_pass()  # evicts `a`; the FAKE device manager then frees VF 0
    evicted = {
        p["metadata"]["name"]
        for p in crds.get(pods)["items"]
        if "deletionTimestamp" in p["metadata"]
    }
    assert evicted == {"a"}
    result = node.agent.run_pass()
    assert result.waiting == {} and node.vfs()[VF[0]] == "vfio-pci"
    assert node.state()["status"]["syncStatus"] == "Succeeded"
    assert any(r == "Evicting" and f"{namespace}/a" in m for _, r, m in events(crds, node.name))


def test_two_nodes_of_a_pool_with_max_unavailable_1_never_disrupt_together(
    crds: Cluster,
    nodes: Callable[..., AgentNode],
    tag: str,
    namespace: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    crds.apply(sriov.pool_config(f"pool-{tag}", 1, {"pxt-sriov-pool": tag}))
    pair = [nodes(i, **{"pxt-sriov-pool": tag}) for i in range(2)]
    calm = nodes(2)  # in no pool; its change needs no eviction
    crds.apply(policy(tag, "net", numVfs=2))
    for node in (*pair, calm):
        node.agent.run_pass()
    res = RESOURCE.format("net")
    for i, node in enumerate(pair):
        run_pod(crds, namespace, f"p{i}", node.name, {res: VF[:1]})

    # Disruption windows: from a node's first eviction to the release of its slot.
    windows: dict[str, list[float]] = {}
    reported: dict[str, str] = {}  # a node's syncStatus as its slot is released
    lock = threading.Lock()
    real_release = LeaseSlots.release

    def evict(api: Any, pod_ref: Any) -> str:
        node = next(n.name for n in pair if api is n.agent.api)
        with lock:
            windows.setdefault(node, [time.monotonic(), 0.0])
        return evict_pod(api, pod_ref)

    def release(slots: LeaseSlots) -> None:
        if slots.held:
            holder = next(n for n in pair if n.name == slots.holder)
            sync = holder.state()["status"]["syncStatus"]
            with lock:
                windows.get(slots.holder, [0.0, 0.0])[1] = time.monotonic()
                reported[slots.holder] = sync
        real_release(slots)

    def both_released() -> bool:
        with lock:
            return len(windows) == 2 and all(w[1] for w in windows.values())

    monkeypatch.setattr(agent_module, "evict", evict)
    monkeypatch.setattr(LeaseSlots, "release", release)
    crds.apply(policy(tag, "net", numVfs=4))  # a resize under both pods
    for node in (*pair, calm):
        node.agent.start()
    wait_for(lambda: len(calm.vfs()) == 4, "the node that evicts nothing resized", 30)
    wait_for(lambda: all(len(n.vfs()) == 4 for n in pair), "both pool nodes resized", 60)
    wait_for(both_released, "both slots released", 30)
    (first, second) = sorted(windows.values())
    assert first[1] <= second[0], f"disruption windows overlap: {windows}"
    assert reported == {n.name: "Succeeded" for n in pair}, (
        f"a slot released before its node said so: {reported}"
    )


def test_the_docs_example_is_what_the_agent_writes(
    crds: Cluster, nodes: Callable[..., AgentNode]
) -> None:
    """docs/sriov.md's "Provisioning VFs" policies and SriovNetwork, applied as they are:
    the NAD and the node state the agent writes are the ones the page shows."""
    shown: dict[str, list[Json]] = {}
    for block in blocks([REPO / "docs" / "sriov.md"]):
        if block.lang == "yaml" and block.heading == "Provisioning VFs":
            for doc in yaml.safe_load_all(block.text):
                shown.setdefault(doc["kind"], []).append(doc)
    node = nodes(**shown["SriovNetworkNodePolicy"][0]["spec"]["nodeSelector"])
    (net,) = shown["SriovNetwork"]
    crds.create_namespace(net["spec"]["networkNamespace"])
    for obj in (*shown["SriovNetworkNodePolicy"], net):
        crds.apply(obj)
    try:
        node.agent.run_pass()
        (nad,) = shown["NetworkAttachmentDefinition"]
        meta = nad["metadata"]
        written = crds.get(f"{sriov.NADS.format(ns=meta['namespace'])}/{meta['name']}")
        assert written["metadata"]["annotations"] == meta["annotations"]
        assert written["spec"] == nad["spec"]
        (state,) = shown["SriovNetworkNodeState"]
        found = node.state()
        assert found["metadata"]["annotations"] == state["metadata"]["annotations"]
        assert (found["spec"], found["status"]) == (state["spec"], state["status"])
    finally:
        crds.request("DELETE", f"{sriov.NETWORKS.format(ns=NAMESPACE)}/{net['metadata']['name']}")
        node.agent.run_pass()  # the finalizer: the NAD goes, then the SriovNetwork
        for obj in shown["SriovNetworkNodePolicy"]:
            crds.request("DELETE", f"{sriov.POLICIES}/{obj['metadata']['name']}")

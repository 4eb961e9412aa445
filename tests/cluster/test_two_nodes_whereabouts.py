"""The LAN NAD's whereabouts IPAM across two real nodes that share no IPAM state on disk.

Each node's daemon allocates in process from one IPPool on the API server
(tests/cluster/twonodes.py). A burst of pods on both nodes at once gets distinct addresses
that reach each other; DEL gives them back; a node whose daemon is killed and whose pods
are then force-deleted gets its addresses back too (the runtime's DEL, retried until the
restarted daemon serves it, or the daemon's reconcile).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.cluster import install
from tests.cluster.kubelet import KubeletNode, create_nad
from tests.cluster.test_two_nodes import check_ping_across
from tests.cluster.twonodes import LAN_SUBNET, PodOnNode, TwoNodes, check_networks

pytestmark = pytest.mark.timeout(900)

PER_NODE = 6  # pods per node in the burst
WINDOW_TIMEOUT = 240.0


@pytest.fixture
def lan(two_nodes: TwoNodes, namespace: str) -> Iterator[TwoNodes]:
    """The nodes with the LAN NAD in `namespace`; the test's pods are gone after it."""
    create_nad(two_nodes.cluster, namespace, "lan-net", two_nodes.macvlan_conf(LAN_SUBNET))
    yield two_nodes
    pods = two_nodes.cluster.get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    by_name = {kn.name: kn for kn in two_nodes.nodes}
    for pod in pods:
        kn = by_name.get(pod["spec"].get("nodeName", ""))
        if kn is not None:
            kn.delete_pod(namespace, pod["metadata"]["name"])


def create_all(tn: TwoNodes, namespace: str, pods: list[tuple[KubeletNode, str]]) -> None:
    """Create the pods at once (one request each, in parallel)."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    with ThreadPoolExecutor(8) as pool:
        jobs = [
            pool.submit(tn.cluster.create, path, kn.pod_manifest(n, "lan-net")) for kn, n in pods
        ]
        for job in jobs:
            job.result()


def wait_until(tn: TwoNodes, namespace: str, what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + WINDOW_TIMEOUT
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {WINDOW_TIMEOUT:.0f} s for {what}\n{tn.dump(namespace)}")
        time.sleep(0.2)


def test_a_burst_on_both_nodes_gets_distinct_addresses_that_reach_each_other(
    lan: TwoNodes, namespace: str
) -> None:
    tn = lan
    assert tn.reserved_ips() == []
    wanted = [(kn, f"burst-{i}-{j}") for j in range(PER_NODE) for i, kn in enumerate(tn.nodes)]
    create_all(tn, namespace, wanted)
    pods = [PodOnNode(kn, namespace, name) for kn, name in wanted]
    for pod in pods:
        check_networks(pod, namespace)
    addresses = [pod.ip("net1") for pod in pods]
    assert len(set(addresses)) == len(pods), addresses
    assert tn.reserved_ips() == sorted(addresses)
    check_ping_across(tn, pods[0], pods[1])  # node 1's first pod and node 2's

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: p.kn.delete_pod(namespace, p.name), pods))
    assert tn.reserved_ips() == []


def test_a_killed_daemons_force_deleted_pods_give_their_addresses_back(
    lan: TwoNodes, namespace: str
) -> None:
    tn = lan
    if not tn.image:
        pytest.skip("Plexus is started by hand here: this tree cannot build its image")
    kn, other = tn.nodes
    wanted = [(kn, f"doomed-{j}") for j in range(3)] + [(other, "survivor")]
    create_all(tn, namespace, wanted)
    pods = [PodOnNode(k, namespace, name) for k, name in wanted]
    doomed = {pod.ip("net1") for pod in pods[:3]}
    assert set(tn.reserved_ips()) == doomed | {pods[3].ip("net1")}

    os.kill(install.daemon_pid(kn), signal.SIGKILL)
    for pod in pods[:3]:
        tn.cluster.request(
            "DELETE",
            f"/api/v1/namespaces/{namespace}/pods/{pod.name}",
            {"gracePeriodSeconds": 0},
        )
    wait_until(
        tn,
        namespace,
        "the killed daemon's node to give its pods' addresses back",
        lambda: set(tn.reserved_ips()) == {pods[3].ip("net1")},
    )
    uids = [pod.uid for pod in pods[:3]]
    kn.wait_for("the doomed pods' sandboxes to be gone", lambda: not any(map(kn.sandboxes, uids)))

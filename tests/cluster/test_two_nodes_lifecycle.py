"""Plexus's DaemonSet on two real nodes: upgraded and killed while pods come and go, then
uninstalled.

Only where Plexus runs from its image (tests/cluster/install.py). Pods are created while a
node's daemon is being replaced or restarted; each must end up Running with eth0 and net1
(an ADD that finds no daemon fails and the kubelet retries it), never with eth0 alone;
pods that ran through it keep their interfaces; deleting them all releases every address,
record and link. Uninstalling as docs/install.md says (`kubectl delete -k` the install's
overlay, then an overlay of crds/uninstall, whose pods run `plexus uninstall-cni`, on
every node) leaves each node with its primary network only.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from meta.daemon.config import GENERATED_NAME
from tests.cluster import install
from tests.cluster.apiserver import ApiError
from tests.cluster.kubelet import KubeletNode, create_nad, reserved_ips
from tests.cluster.twonodes import LAN_SUBNET, PodOnNode, TwoNodes, check_networks
from tests.runtime.conftest import addresses

pytestmark = pytest.mark.timeout(900)

NEXT_IMAGE = "localhost/plexus:dev2"  # the same image re-tagged: the upgrade's target
WINDOW_TIMEOUT = 240.0  # for a rollout or restart (pod deletion, start, informer sync)

Json = dict[str, Any]


@pytest.fixture
def tn(two_nodes: TwoNodes, namespace: str) -> Iterator[TwoNodes]:
    """The nodes with Plexus from its image and the LAN NAD in `namespace`."""
    if not two_nodes.image:
        pytest.skip("Plexus is started by hand here: this tree cannot build its image")
    create_nad(two_nodes.cluster, namespace, "lan-net", two_nodes.macvlan_conf(LAN_SUBNET))
    yield two_nodes


class Held:
    """What the nodes hold outside pods that DEL must give back: per node the host-side
    links (the primary's veths; its bridge, made by the first pod, stays), the primary
    network's addresses and Plexus's records; the LAN NAD's addresses."""

    def __init__(self, tn: TwoNodes) -> None:
        self.nodes = [
            (
                set(addresses(f"/run/netns/{kn.node.name}")) - {kn.node.bridge_conf()["bridge"]},
                reserved_ips(kn.var_lib_cni / "networks"),
                kn.records(),
            )
            for kn in tn.nodes
        ]
        self.lan_ips = tn.reserved_ips()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Held) and vars(self) == vars(other)

    def __repr__(self) -> str:
        return f"Held({vars(self)})"


class Pods:
    """The test's pods, each bound to a node, created one by one."""

    def __init__(self, tn: TwoNodes, namespace: str) -> None:
        self.tn = tn
        self.namespace = namespace
        self.created: list[tuple[str, KubeletNode]] = []

    def create(self, kn: KubeletNode, prefix: str) -> str:
        name = f"{prefix}{len(self.created)}"
        self.tn.cluster.create(
            f"/api/v1/namespaces/{self.namespace}/pods", kn.pod_manifest(name, "lan-net")
        )
        self.created.append((name, kn))
        return name

    def running(self) -> list[PodOnNode]:
        """Every pod Running with eth0 + net1 and its network-status (checked)."""
        pods = []
        for name, kn in self.created:
            try:
                self._not_primary_only(kn, name)
                pod = PodOnNode(kn, self.namespace, name)
                check_networks(pod, self.namespace)
            except AssertionError as err:
                raise AssertionError(f"pod {name}: {err}\n{self.tn.dump(self.namespace)}") from None
            pods.append(pod)
        return pods

    def _not_primary_only(self, kn: KubeletNode, name: str) -> None:
        """Fail at once on a pod that started without Plexus (its network-status will
        never come)."""
        uid = kn.wait_running(self.namespace, name)["metadata"]["uid"]
        (sandbox,) = kn.sandboxes(uid, ready_only=True)
        links = sorted(addresses(kn.sandbox_netns(sandbox.id)))
        assert "net1" in links, f"Running with {links} only: its ADD bypassed Plexus"

    def delete_all(self) -> None:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda item: item[1].delete_pod(self.namespace, item[0]), self.created))
        self.created.clear()


@pytest.fixture
def pods(tn: TwoNodes, namespace: str) -> Iterator[Pods]:
    """The test's pods; whatever a failed test left is deleted, so the next one starts
    from nodes holding nothing of it."""
    made = Pods(tn, namespace)
    yield made
    with contextlib.suppress(AssertionError, ApiError):
        made.delete_all()


def failed_adds(tn: TwoNodes, namespace: str) -> dict[str, int]:
    """Pod -> how many of its sandboxes failed (an ADD the kubelet then retried)."""
    events = tn.cluster.get(f"/api/v1/namespaces/{namespace}/events")["items"]
    return {
        e["involvedObject"]["name"]: e.get("count", 1)
        for e in events
        if e.get("reason") == "FailedCreatePodSandBox"
    }


def ready(pod: Json) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def on_node(pod: Json, kn: KubeletNode) -> bool:
    """A daemon pod of the node, bound or still waiting for the scheduler (the DaemonSet
    controller pins it with a node affinity on the node's name)."""
    if pod["spec"].get("nodeName"):
        return bool(pod["spec"]["nodeName"] == kn.name)
    return f"'values': ['{kn.name}']" in str(pod["spec"].get("affinity"))


def poll(tn: TwoNodes, namespace: str, what: str, done: Callable[[], bool]) -> None:
    """Call `done()` until true; on timeout fail with the cluster's state."""
    deadline = time.monotonic() + WINDOW_TIMEOUT
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {WINDOW_TIMEOUT:.0f} s for {what}\n{tn.dump(namespace)}")
        time.sleep(0.2)


def test_rolling_upgrade_while_pods_are_created(tn: TwoNodes, namespace: str, pods: Pods) -> None:
    before = Held(tn)
    for kn in tn.nodes:
        pods.create(kn, "before")
    running = pods.running()
    archive = install.build_image(NEXT_IMAGE)  # the same tree: only another tag
    with ThreadPoolExecutor(len(tn.nodes)) as pool:
        list(pool.map(lambda kn: install.import_image(kn, archive, NEXT_IMAGE), tn.nodes))
    old = {kn.name: install.daemon_pod(tn.cluster, kn)["metadata"]["uid"] for kn in tn.nodes}

    install.set_image(tn.cluster, NEXT_IMAGE)
    tn.image = NEXT_IMAGE
    # One pod per node as the rollout starts, one when its old daemon is seen stopping (or
    # gone), one when its new daemon is seen starting: the window where a Multus-style
    # daemon would have left pods with eth0 only.
    seen: dict[str, set[str]] = {kn.name: set() for kn in tn.nodes}
    during: list[str] = []
    for kn in tn.nodes:
        during.append(pods.create(kn, "during"))

    def rolled_out() -> bool:
        daemons = install.daemon_pods(tn.cluster)
        for kn in tn.nodes:
            mine = [p for p in daemons if on_node(p, kn)]
            new = [p for p in mine if p["metadata"]["uid"] != old[kn.name]]
            phase = "done" if new and ready(new[0]) else "starting" if new else "stopping"
            if not new and any(not p["metadata"].get("deletionTimestamp") for p in mine):
                phase = "old"
            if phase in ("stopping", "starting") and phase not in seen[kn.name]:
                seen[kn.name].add(phase)
                during.append(pods.create(kn, f"{phase}-"))
        return install.daemonset_ready(tn.cluster, len(tn.nodes), NEXT_IMAGE)

    poll(tn, namespace, f"the rollout of {NEXT_IMAGE}", rolled_out)
    print(f"upgrade: pods created during the rollout: {during}; windows seen: {seen}")
    assert all(seen.values()), f"no pod created while a daemon was down: {seen}"
    new = {kn.name: install.daemon_pod(tn.cluster, kn) for kn in tn.nodes}
    for name, daemon in new.items():
        assert daemon["metadata"]["uid"] != old[name], f"{name}'s daemon pod was not replaced"
        assert daemon["spec"]["containers"][0]["image"] == NEXT_IMAGE

    for pod in running:  # running pods kept their interfaces, addresses and MACs
        assert addresses(pod.netns) == pod.links, pod.name
    pods.running()
    print(f"upgrade: ADDs failed and retried by the kubelet: {failed_adds(tn, namespace)}")
    pods.delete_all()
    assert Held(tn) == before  # DEL gave everything back


def test_daemon_killed_and_restarted_by_the_kubelet(
    tn: TwoNodes, namespace: str, pods: Pods
) -> None:
    before = Held(tn)
    kn = tn.nodes[0]
    pods.create(kn, "before")
    (running,) = pods.running()
    daemon = install.daemon_pod(tn.cluster, kn)
    uid = daemon["metadata"]["uid"]
    restarts = daemon["status"]["containerStatuses"][0]["restartCount"]

    os.kill(install.daemon_pid(kn), signal.SIGKILL)
    pods.create(kn, "killed")
    seen_down = False

    def restarted() -> bool:
        nonlocal seen_down
        pod = install.daemon_pod(tn.cluster, kn)
        (status,) = pod["status"]["containerStatuses"]
        if not status["ready"] and not seen_down:
            seen_down = True
            pods.create(kn, "down")
        return bool(status["restartCount"] > restarts and ready(pod))

    poll(tn, namespace, "the kubelet to restart the killed daemon", restarted)
    assert seen_down, "the killed daemon was never seen not ready"
    # The kubelet restarted the daemon's container in the same pod.
    assert install.daemon_pod(tn.cluster, kn)["metadata"]["uid"] == uid
    assert addresses(running.netns) == running.links
    pods.running()
    print(f"kill: ADDs failed and retried by the kubelet: {failed_adds(tn, namespace)}")
    pods.delete_all()
    assert Held(tn) == before  # DEL gave everything back


def test_uninstall_leaves_the_primary_network_only(tn: TwoNodes, namespace: str) -> None:
    pids = {kn.name: install.daemon_pid(kn) for kn in tn.nodes}
    daemons = {kn.name: install.daemon_pod(tn.cluster, kn)["metadata"]["uid"] for kn in tn.nodes}
    tn.uninstall_plexus()
    for kn in tn.nodes:
        assert sorted(p.name for p in kn.net_dir.iterdir()) == ["10-default.conflist"]
        assert not [p.name for p in kn.node.bin.iterdir() if p.name.startswith("plexus")]
        assert not kn.cni_state.exists(), f"records left: {sorted(kn.records())}"
        assert not (kn.run_dir / "plexus").exists(), "the socket dir is left"
        assert not Path(f"/proc/{pids[kn.name]}").exists(), "the daemon process is left"
        assert kn.sandboxes(daemons[kn.name], ready_only=True) == []  # the kubelet GCs it
        kn.wait_cni_network("default-net")
    # A pod asking for the NAD now gets each node's primary network and nothing else.
    for kn in tn.nodes:
        manifest = kn.pod_manifest(f"after-{kn.node.tag}", "lan-net")
        pod = kn.run_pod(namespace, manifest)
        (sandbox,) = kn.sandboxes(pod["metadata"]["uid"], ready_only=True)
        links = addresses(kn.sandbox_netns(sandbox.id))
        assert sorted(links) == ["eth0", "lo"]
        (ip,) = links["eth0"]["ips"]
        assert ipaddress.ip_address(ip) in ipaddress.ip_network(kn.pod_subnet)
        kn.delete_pod(namespace, manifest["metadata"]["name"])
        assert not (kn.net_dir / GENERATED_NAME).exists()

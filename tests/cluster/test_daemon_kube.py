"""The daemon against a real kube-apiserver: informers, network-status, events, outages."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from tests.cluster.apiserver import Cluster, audit_events
from tests.cluster.forward import LoopbackForward
from tests.netns.conftest import Node
from tests.netns.daemon import Daemon
from tests.wait import wait_for

STATUS = "k8s.v1.cni.cncf.io/network-status"
API_WAIT = 90.0  # for what the daemon writes in the background (events, queued statuses)


class KubeNode:
    """A node namespace whose daemon watches the test cluster."""

    def __init__(self, node: Node, cluster: Cluster, namespace: str) -> None:
        self.node = node
        self.cluster = cluster
        self.namespace = namespace
        port = int(cluster.server.rsplit(":", 1)[1])
        self.forward = LoopbackForward(f"/run/netns/{node.name}", port)
        self.forward.start()
        self.extra: dict[str, Any] = {}
        self.daemon = Daemon(node, **self.settings())
        self.daemon.start()

    def settings(self, **extra: Any) -> dict[str, Any]:
        return {"clusterDir": "", "kubeconfig": str(self.cluster.kubeconfig), **self.extra, **extra}

    def conf(self, **extra: Any) -> dict[str, Any]:
        return self.node.meta(**self.settings(**extra))

    def configure(self, **extra: Any) -> None:
        """Run the daemon with these settings on top of the usual ones (a call's config
        cannot override the daemon's: meta/authority.py); what was added under the old
        ones is DELeted through the old daemon first."""
        if extra == self.extra:
            return
        for call in reversed(self.node.added):
            self.node.cni("DEL", **call)
        self.node.added.clear()
        self.daemon.stop()
        self.extra = extra
        self.daemon = Daemon(self.node, **self.settings())
        self.daemon.start()

    def cached(self, resource: str) -> int:
        """How many objects of `resource` ("pods", "nads") the daemon's informer holds."""
        return int(self.daemon.metric("plexus_informer_objects", resource=resource))

    @contextmanager
    def delivered(self, resource: str, change: int = 1) -> Iterator[None]:
        """Wait, after the block, until the daemon's `resource` informer holds `change`
        objects more (fewer, if negative) than before it: the block's creations (or
        deletions) have reached the daemon's cache."""
        before = self.cached(resource)
        yield
        wait_for(
            lambda: self.cached(resource) == before + change,
            f"the daemon's {resource} informer going from {before} to {before + change}",
        )

    def nad(self, name: str, config: dict[str, Any], namespace: str = "") -> None:
        """Create a NAD; return once the daemon's informer has it."""
        ns = namespace or self.namespace
        with self.delivered("nads"):
            self.cluster.create(
                f"/apis/k8s.cni.cncf.io/v1/namespaces/{ns}/network-attachment-definitions",
                {
                    "apiVersion": "k8s.cni.cncf.io/v1",
                    "kind": "NetworkAttachmentDefinition",
                    "metadata": {"name": name},
                    "spec": {"config": json.dumps(config)},
                },
            )

    def nads_delivered(self) -> None:
        """Return once the daemon's NAD informer has every NAD change made so far: a
        marker NAD made now reaches it after them (one watch delivers them in order)."""
        self.nad(f"marker-{uuid.uuid4().hex[:8]}", {"cniVersion": "1.0.0", "type": "marker"})

    def pod(self, name: str, networks: str, namespace: str = "", **annotations: str) -> str:
        """create_pod(), returning once the daemon's informer has the pod."""
        with self.delivered("pods"):
            return self.create_pod(name, networks, namespace, **annotations)

    def create_pod(self, name: str, networks: str, namespace: str = "", **annotations: str) -> str:
        """Create a pod on the daemon's node; its UID."""
        ns = namespace or self.namespace
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "annotations": {"k8s.v1.cni.cncf.io/networks": networks, **annotations},
            },
            "spec": {
                "nodeName": "test-node",
                "containers": [{"name": "app", "image": "pause"}],
            },
        }
        created = self.cluster.create(f"/api/v1/namespaces/{ns}/pods", body)
        return str(created["metadata"]["uid"])

    def get_pod(self, name: str, namespace: str = "") -> dict[str, Any]:
        pod: dict[str, Any] = self.cluster.get(
            f"/api/v1/namespaces/{namespace or self.namespace}/pods/{name}"
        )
        return pod

    def add(self, pod: str, uid: str, namespace: str = "", **settings: Any) -> tuple[str, Any]:
        """ADD through a daemon run with `settings` (restarted if they changed)."""
        self.configure(**settings)
        netns = self.node.pod_netns()
        done = self.node.cni(
            "ADD",
            netns=netns,
            cid=f"c-{pod}",
            pod=pod,
            uid=uid,
            namespace=namespace or self.namespace,
            conf=self.conf(),
        )
        return netns, done

    def close(self) -> None:
        self.forward.stop()
        self.forward.start()  # DELs in cleanup need no API server, but informers may
        self.node.close()
        self.node.added.clear()
        self.daemon.stop()
        self.forward.stop()


@pytest.fixture
def kube(node: Node, cluster: Cluster, namespace: str) -> Iterator[KubeNode]:
    k = KubeNode(node, cluster, namespace)
    try:
        yield k
    finally:
        k.close()


def _events(kube: KubeNode, namespace: str = "") -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kube.cluster.get(
        f"/api/v1/namespaces/{namespace or kube.namespace}/events"
    )["items"]
    return items


def test_add_writes_network_status_with_no_get_and_one_status_write(kube: KubeNode) -> None:
    kube.nad("macvlan-net", kube.node.macvlan_conf())
    uid = kube.pod("web", "macvlan-net")
    before = len(audit_events(kube.cluster.audit_log, "plexus/"))

    netns, done = kube.add("web", uid)

    assert done.returncode == 0, done.stdout
    assert kube.node.links(netns) == ["eth0", "lo", "net1"]
    status = json.loads(kube.get_pod("web")["metadata"]["annotations"][STATUS])
    assert [(s["name"], s["interface"]) for s in status] == [
        ("default-net", "eth0"),
        (f"{kube.namespace}/macvlan-net", "net1"),
    ]
    requests = audit_events(kube.cluster.audit_log, "plexus/")[before:]
    calls = [
        (e["verb"], e["objectRef"].get("resource"), e["objectRef"].get("subresource"))
        for e in requests
    ]
    assert [c for c in calls if c[0] == "get"] == []
    assert calls.count(("patch", "pods", "status")) == 1
    wait_for(lambda: len(_events(kube)) >= 2, "events", API_WAIT)
    reasons = sorted(e["reason"] for e in _events(kube))
    assert reasons == ["AddedInterface", "AddedInterface"]


def test_nad_created_updated_and_deleted_while_running(kube: KubeNode) -> None:
    kube.nad("late", kube.node.macvlan_conf("10.61.0.0/16"))
    uid = kube.pod("p1", "late")
    _, first = kube.add("p1", uid)
    assert first.returncode == 0, first.stdout
    assert json.loads(kube.get_pod("p1")["metadata"]["annotations"][STATUS])[1]["ips"][
        0
    ].startswith("10.61.")

    path = (
        f"/apis/k8s.cni.cncf.io/v1/namespaces/{kube.namespace}/network-attachment-definitions/late"
    )
    kube.cluster.merge_patch(
        path, {"spec": {"config": json.dumps(kube.node.macvlan_conf("10.62.0.0/16"))}}
    )
    kube.nads_delivered()
    uid2 = kube.pod("p2", "late")
    _, second = kube.add("p2", uid2)
    assert second.returncode == 0, second.stdout
    assert json.loads(kube.get_pod("p2")["metadata"]["annotations"][STATUS])[1]["ips"][
        0
    ].startswith("10.62.")

    with kube.delivered("nads", -1):
        kube.cluster.request("DELETE", path)
    uid3 = kube.pod("p3", "late")
    netns, third = kube.add("p3", uid3)
    error = json.loads(third.stdout)
    assert third.returncode == 1 and f"{kube.namespace}/late" in error["msg"]
    assert kube.node.links(netns) == ["lo"]
    wait_for(
        lambda: "NoNetworkFound" in [e["reason"] for e in _events(kube)], "NoNetworkFound", API_WAIT
    )


def test_nad_in_another_namespace_with_isolation_on_and_off(kube: KubeNode) -> None:
    other = f"pxt-{uuid.uuid4().hex[:8]}"
    kube.cluster.create_namespace(other)
    kube.nad("shared", kube.node.macvlan_conf(), namespace=other)
    uid = kube.pod("iso", f"{other}/shared")

    netns, refused = kube.add("iso", uid, namespaceIsolation=True)
    assert refused.returncode == 1 and "namespaceIsolation" in json.loads(refused.stdout)["msg"]
    assert kube.node.links(netns) == ["lo"]

    netns, allowed = kube.add("iso", uid, namespaceIsolation=False)
    assert allowed.returncode == 0, allowed.stdout
    assert kube.node.links(netns) == ["eth0", "lo", "net1"]


def test_default_network_annotation_isolation_and_naming_as_multus(kube: KubeNode) -> None:
    """Isolation covers `v1.multus-cni.io/default-network`; a NAD default network is named
    `<namespace>/<nad>` in network-status and events; globalNamespaces unset means
    `default`, as in Multus."""
    other = f"pxt-{uuid.uuid4().hex[:8]}"
    kube.cluster.create_namespace(other)
    shared = f"shared-{uuid.uuid4().hex[:6]}"  # the default namespace is the whole run's
    kube.nad("alt", kube.node.bridge_conf(name="inner"))
    kube.nad("alt", kube.node.bridge_conf(name="inner"), namespace=other)
    kube.nad(shared, kube.node.macvlan_conf(), namespace="default")
    default_network = "v1.multus-cni.io/default-network"
    bypass = kube.pod("bypass", "", **{default_network: f"{other}/alt"})
    own = kube.pod("own", f"default/{shared}", **{default_network: f"{kube.namespace}/alt"})

    netns, refused = kube.add("bypass", bypass, namespaceIsolation=True)
    error = json.loads(refused.stdout)
    assert refused.returncode == 1 and error["code"] == 7
    assert f"may not use network {other}/alt: namespaceIsolation" in error["msg"]
    assert kube.node.links(netns) == ["lo"]

    netns, allowed = kube.add("own", own, namespaceIsolation=True)
    assert allowed.returncode == 0, allowed.stdout
    status = json.loads(kube.get_pod("own")["metadata"]["annotations"][STATUS])
    assert [(s["name"], s["interface"]) for s in status] == [
        (f"{kube.namespace}/alt", "eth0"),
        (f"default/{shared}", "net1"),
    ]

    def added() -> list[str]:
        return [e["message"] for e in _events(kube) if e["reason"] == "AddedInterface"]

    wait_for(lambda: len(added()) >= 2, "AddedInterface events", API_WAIT)
    assert sorted(m.split(" from ")[1] for m in added()) == [
        f"default/{shared}",
        f"{kube.namespace}/alt",
    ]


def test_api_server_away_during_add_of_a_cached_pod(kube: KubeNode) -> None:
    kube.nad("macvlan-net", kube.node.macvlan_conf())
    uid = kube.pod("cached", "macvlan-net")  # in the informer cache before the outage

    kube.forward.stop()
    try:
        netns, done = kube.add("cached", uid)
        assert done.returncode == 0, done.stdout
        assert kube.node.links(netns) == ["eth0", "lo", "net1"]
        deleted = kube.node.cni(
            "DEL",
            netns=netns,
            cid="c-cached",
            pod="cached",
            namespace=kube.namespace,
            conf=kube.conf(),
        )
        assert deleted.returncode == 0, deleted.stdout  # DEL never needs the API server
        assert STATUS not in kube.get_pod("cached")["metadata"].get("annotations", {})
    finally:
        kube.forward.start()
    wait_for(
        lambda: STATUS in kube.get_pod("cached")["metadata"].get("annotations", {}),
        "the queued network-status",
        API_WAIT,
    )


def test_pod_gone_gets_an_empty_result(kube: KubeNode) -> None:
    netns, done = kube.add("never-created", "some-uid")
    assert done.returncode == 0, done.stdout
    assert not json.loads(done.stdout).get("interfaces")
    assert kube.node.links(netns) == ["lo"]


def _status_when(kube: KubeNode, pod: str, want: int) -> list[tuple[str, str]]:
    """The pod's network-status (network, interface) once it has `want` entries."""
    deadline = time.monotonic() + 20
    while True:
        notes = kube.get_pod(pod)["metadata"].get("annotations", {})
        found = [(e["name"], e["interface"]) for e in json.loads(notes.get(STATUS, "[]"))]
        if len(found) == want or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_annotation_change_hot_plugs_networks(kube: KubeNode) -> None:
    ns = kube.namespace
    kube.nad("net-a", kube.node.macvlan_conf("10.98.0.0/16"))
    kube.nad("net-b", kube.node.macvlan_conf("10.97.0.0/16"))
    uid = kube.pod("hp", "net-a")
    netns, done = kube.add("hp", uid)
    assert done.returncode == 0, done.stdout + done.stderr
    path = f"/api/v1/namespaces/{ns}/pods/hp"

    kube.cluster.merge_patch(
        path, {"metadata": {"annotations": {"k8s.v1.cni.cncf.io/networks": "net-a,net-b"}}}
    )
    assert _status_when(kube, "hp", 3) == [
        ("default-net", "eth0"),
        (f"{ns}/net-a", "net1"),
        (f"{ns}/net-b", "net2"),
    ]
    assert kube.node.links(netns) == ["eth0", "lo", "net1", "net2"]

    kube.cluster.merge_patch(
        path, {"metadata": {"annotations": {"k8s.v1.cni.cncf.io/networks": "net-b"}}}
    )
    assert _status_when(kube, "hp", 2) == [("default-net", "eth0"), (f"{ns}/net-b", "net2")]
    assert kube.node.links(netns) == ["eth0", "lo", "net2"]
    removed = ("RemovedInterface", f"Remove net1 from {ns}/net-a")
    wait_for(
        lambda: removed in [(e["reason"], e["message"]) for e in _events(kube)], "removal", API_WAIT
    )
    reasons = [(e["reason"], e["message"]) for e in _events(kube)]
    assert any(r == "AddedInterface" and m.startswith("Add net2 [10.97.") for r, m in reasons)


def test_repeated_del_of_a_deleted_pod_asks_the_api_nothing(kube: KubeNode) -> None:
    kube.nad("macvlan-net", kube.node.macvlan_conf())
    uid = kube.pod("gone", "macvlan-net")
    netns, done = kube.add("gone", uid)
    assert done.returncode == 0, done.stdout + done.stderr
    wait_for(lambda: len(_events(kube)) == 2, "the ADD's events", API_WAIT)  # not the DEL's
    path = f"/api/v1/namespaces/{kube.namespace}/pods/gone"
    with kube.delivered("pods", -1):  # gone from the daemon's cache too
        kube.cluster.request("DELETE", path, query={"gracePeriodSeconds": "0"})  # no kubelet
    for _ in range(2):  # containerd's DEL on stop, then again on remove (no record left)
        before = len(audit_events(kube.cluster.audit_log, "plexus/"))
        deleted = kube.node.cni(
            "DEL", netns=netns, cid="c-gone", pod="gone", uid=uid, namespace=kube.namespace,
            conf=kube.conf(),
        )  # fmt: skip
        assert deleted.returncode == 0, deleted.stdout + deleted.stderr
        requests = audit_events(kube.cluster.audit_log, "plexus/")[before:]
        assert [e["verb"] for e in requests] == []
    assert kube.node.links(netns) == ["lo"] and kube.node.reserved_ips() == []

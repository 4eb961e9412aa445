"""Claim-driven attachment (DRA) through the daemon against a real kube-apiserver.

No kubelet or DRA driver runs here: the test publishes the ResourceSlices a node plugin
would (a fake node plugin, named so in the slices' names) and allocates each claim
itself, writing `status.allocation` and `status.reservedFor` as Kubernetes' node e2e
does without a scheduler; for a template claim it writes the pod's
`status.resourceClaimStatuses` as the resourceclaim controller would. The NAD's
delegate is the recorder plugin (tests/netns/test_device_ids.py), so the deviceID it
got is observable without SR-IOV hardware.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from kube.api import KubeAPI
from meta.sources.base import RESOURCE_NAME_ANNOTATION, Pod, PodClaim
from meta.sources.claims import (
    DEVICE_ID_ATTRIBUTE,
    FIELD_MANAGER,
    RESOURCE_NAME_ATTRIBUTE,
    KubeClaims,
)
from tests.cluster.apiserver import REPO, Cluster, audit_events
from tests.cluster.test_daemon_kube import KubeNode
from tests.kubelet import serve
from tests.netns.conftest import Node
from tests.netns.test_device_ids import RECORDER

DRIVER = "sriov.plexus.io"
RESOURCE = "intel.com/sriov_netdevice"
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"
RESOURCE_API = "/apis/resource.k8s.io/v1"
NODE = "test-node"  # the daemon's --node-name (tests/netns/daemon.py)


class DraNode(KubeNode):
    """KubeNode plus the DRA objects a node plugin, scheduler and controller would make."""

    def __init__(self, node: Node, cluster: Cluster, namespace: str) -> None:
        super().__init__(node, cluster, namespace)
        self.tag = uuid.uuid4().hex[:6]
        self.record = node.root / "recorded.jsonl"
        script = node.bin / "recorder"
        script.write_text(RECORDER)
        script.chmod(0o755)
        self.slices: list[str] = []

    def publish(self, driver: str, devices: dict[str, dict[str, str]]) -> str:
        """A ResourceSlice of this node, as a (fake) node plugin publishes it; its pool."""
        short = f"{driver.split('.')[0]}-{self.tag}"
        pool = f"{NODE}/{short}"  # a path, as the node plugin names its pools
        name = f"fake-node-plugin-{NODE}-{short}"
        self.cluster.create(
            f"{RESOURCE_API}/resourceslices",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": name},
                "spec": {
                    "driver": driver,
                    "nodeName": NODE,
                    "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                    "devices": [
                        {"name": device, "attributes": {k: {"string": v} for k, v in attrs.items()}}
                        for device, attrs in devices.items()
                    ],
                },
            },
        )
        self.slices.append(name)
        return pool

    def vf_nad(self, name: str, address: str, resource: str = RESOURCE) -> None:
        """A NAD of `resource` whose plugin records what it gets and returns `address`."""
        plugin = {"type": "recorder", "record": str(self.record), "address": address}
        self.resource_nad(name, {"cniVersion": "1.0.0", "name": name, **plugin}, resource)

    def macvlan_vf_nad(self, name: str) -> None:
        """A NAD of RESOURCE: a real macvlan, then the recorder (which passes its result on)."""
        macvlan = self.node.macvlan_conf("10.79.0.0/16")
        recorder = {"type": "recorder", "record": str(self.record)}
        plugins = [{k: v for k, v in macvlan.items() if k != "cniVersion"}, recorder]
        self.resource_nad(name, {"cniVersion": "1.0.0", "name": name, "plugins": plugins})

    def resource_nad(self, name: str, config: dict[str, Any], resource: str = RESOURCE) -> None:
        """A NAD of `resource`; returns once the daemon's informer has it."""
        with self.delivered("nads"):
            self.cluster.create(
                f"/apis/k8s.cni.cncf.io/v1/namespaces/{self.namespace}/network-attachment-definitions",
                {
                    "apiVersion": "k8s.cni.cncf.io/v1",
                    "kind": "NetworkAttachmentDefinition",
                    "metadata": {"name": name, "annotations": {RESOURCE_NAME_ANNOTATION: resource}},
                    "spec": {"config": json.dumps(config)},
                },
            )

    def claim(self, name: str, requests: list[str]) -> None:
        self.cluster.create(
            f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaims",
            {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name, "finalizers": [DELETE_PROTECTION]},
                "spec": {
                    "devices": {
                        "requests": [
                            {"name": r, "exactly": {"deviceClassName": DRIVER}} for r in requests
                        ]
                    }
                },
            },
        )

    def allocate(self, claim: str, pod: str, uid: str, results: list[dict[str, str]]) -> None:
        """What the scheduler writes: the allocation, and the pod as the claim's consumer."""
        self.cluster.merge_patch(
            self.claim_path(claim) + "/status",
            {
                "status": {
                    "allocation": {"devices": {"results": results}},
                    "reservedFor": [{"resource": "pods", "name": pod, "uid": uid}],
                }
            },
        )

    def claim_path(self, claim: str) -> str:
        return f"{RESOURCE_API}/namespaces/{self.namespace}/resourceclaims/{claim}"

    def claim_pod(self, name: str, networks: str, claims: list[dict[str, str]]) -> str:
        """A pod with `claims`; its UID once the daemon's informer has it."""
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "annotations": {"k8s.v1.cni.cncf.io/networks": networks},
            },
            "spec": {
                "nodeName": NODE,
                "resourceClaims": claims,
                "containers": [
                    {
                        "name": "app",
                        "image": "pause",
                        "resources": {"claims": [{"name": c["name"]} for c in claims]},
                    }
                ],
            },
        }
        with self.delivered("pods"):
            created = self.cluster.create(f"/api/v1/namespaces/{self.namespace}/pods", body)
        return str(created["metadata"]["uid"])

    def devices_status(self, claim: str) -> list[dict[str, Any]]:
        devices: list[dict[str, Any]] = self.claim_obj(claim).get("status", {}).get("devices", [])
        return devices

    def claim_obj(self, claim: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.cluster.get(self.claim_path(claim))
        return obj

    def recorded(self) -> list[tuple[str, str]]:
        """(ifname, deviceID) of every ADD the recorder plugin saw."""
        lines = self.record.read_text().splitlines() if self.record.exists() else []
        adds = [json.loads(line) for line in lines if json.loads(line)["cmd"] == "ADD"]
        return [(a["ifname"], a["conf"].get("deviceID", "")) for a in adds]

    def calls_since(self, before: int) -> list[tuple[str, str, str]]:
        requests = audit_events(self.cluster.audit_log, "plexus/")[before:]
        return [
            (e["verb"], e["objectRef"].get("resource", ""), e["objectRef"].get("subresource", ""))
            for e in requests
            if e["verb"] != "watch"
        ]

    def audit_mark(self) -> int:
        return len(audit_events(self.cluster.audit_log, "plexus/"))

    def close(self) -> None:
        try:
            super().close()
        finally:
            for name in self.slices:
                self.cluster.request("DELETE", f"{RESOURCE_API}/resourceslices/{name}")


@pytest.fixture
def dra(node: Node, cluster: Cluster, namespace: str) -> Iterator[DraNode]:
    with contextlib.closing(DraNode(node, cluster, namespace)) as d:
        yield d


def _kernel_view(netns: str, ifname: str) -> dict[str, Any]:
    """The interface in the pod's namespace as networkData describes it."""
    out = subprocess.run(
        ["ip", "-n", os.path.basename(netns), "-j", "addr", "show", "dev", ifname],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    (link,) = json.loads(out)
    ips = [f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a["scope"] == "global"]
    return {"interfaceName": link["ifname"], "ips": ips, "hardwareAddress": link["address"]}


def _vf(pci: str, resource: str = RESOURCE) -> dict[str, str]:
    return {RESOURCE_NAME_ATTRIBUTE: resource, DEVICE_ID_ATTRIBUTE: pci}


def _result(request: str, driver: str, pool: str, device: str) -> dict[str, str]:
    return {"request": request, "driver": driver, "pool": pool, "device": device}


def test_claim_device_id_reaches_the_delegate_and_network_data_the_claim(dra: DraNode) -> None:
    vf_pool = dra.publish(
        DRIVER, {"vf-3b-02-1": _vf("0000:3b:02.1"), "vf-3b-02-2": _vf("0000:3b:02.2")}
    )
    gpu_pool = dra.publish("gpu.example.com", {"gpu-0": {}})  # no Multus attributes
    dra.macvlan_vf_nad("vf-net")
    dra.claim("vf-claim", ["vf", "gpu"])
    uid = dra.claim_pod("dra", "vf-net", [{"name": "vf", "resourceClaimName": "vf-claim"}])
    dra.allocate(
        "vf-claim",
        "dra",
        uid,
        [
            _result("vf", DRIVER, vf_pool, "vf-3b-02-2"),
            _result("gpu", "gpu.example.com", gpu_pool, "gpu-0"),
        ],
    )
    before = dra.audit_mark()

    netns, done = dra.add("dra", uid)

    assert done.returncode == 0, done.stdout + done.stderr
    assert dra.recorded() == [("net1", "0000:3b:02.2")]
    (status,) = dra.devices_status("vf-claim")  # the GPU got none
    assert {k: status[k] for k in ("driver", "pool", "device")} == {
        "driver": DRIVER,
        "pool": vf_pool,
        "device": "vf-3b-02-2",
    }
    assert status["networkData"] == _kernel_view(netns, "net1")
    assert status["networkData"]["ips"][0].startswith("10.79.")
    (ready,) = status["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "NetworkAttached")
    managers = [
        (m["manager"], m["operation"], m.get("subresource"))
        for m in dra.claim_obj("vf-claim")["metadata"]["managedFields"]
    ]
    assert (FIELD_MANAGER, "Apply", "status") in managers
    # One GET per claim, and the slice informer's first list (the node's first claim).
    calls = dra.calls_since(before)
    reads = [c for c in calls if c[0] in ("get", "list")]
    assert reads == [("list", "resourceslices", ""), ("get", "resourceclaims", "")]
    assert calls.count(("patch", "resourceclaims", "status")) == 1
    assert calls.count(("patch", "pods", "status")) == 1


def test_second_pod_reads_only_its_claim(dra: DraNode) -> None:
    pool = dra.publish(DRIVER, {"vf-a": _vf("0000:3b:02.1"), "vf-b": _vf("0000:3b:02.2")})
    dra.vf_nad("vf-net", "10.77.0.6/24")
    for n, device in enumerate(("vf-a", "vf-b")):
        dra.claim(f"c{n}", ["vf"])
        uid = dra.claim_pod(f"p{n}", "vf-net", [{"name": "vf", "resourceClaimName": f"c{n}"}])
        dra.allocate(f"c{n}", f"p{n}", uid, [_result("vf", DRIVER, pool, device)])
        before = dra.audit_mark()  # the slice informer listed at the first ADD
        _, done = dra.add(f"p{n}", uid)
        assert done.returncode == 0, done.stdout + done.stderr
    reads = [c for c in dra.calls_since(before) if c[0] in ("get", "list")]
    assert reads == [("get", "resourceclaims", "")]
    assert dra.recorded() == [("net1", "0000:3b:02.1"), ("net1", "0000:3b:02.2")]


def test_claims_are_not_read_without_a_network_that_has_a_resource(dra: DraNode) -> None:
    dra.nad("macvlan-net", dra.node.macvlan_conf())
    dra.claim("gpu-claim", ["gpu"])  # never allocated: reading it would fail the ADD
    uid = dra.claim_pod("gpu", "macvlan-net", [{"name": "gpu", "resourceClaimName": "gpu-claim"}])
    before = dra.audit_mark()

    netns, done = dra.add("gpu", uid)

    assert done.returncode == 0, done.stdout + done.stderr
    assert dra.node.links(netns) == ["eth0", "lo", "net1"]
    assert [c for c in dra.calls_since(before) if c[0] in ("get", "list")] == []


def test_template_claim_through_pod_status(dra: DraNode) -> None:
    pool = dra.publish(DRIVER, {"vf-t": _vf("0000:3b:03.1")})
    dra.vf_nad("vf-net", "10.77.0.7/24")
    claims = [{"name": "vf", "resourceClaimTemplateName": "vf-template"}]
    uid = dra.claim_pod("tpl", "vf-net", claims)
    generated = "tpl-vf-x7k2p"
    dra.claim(generated, ["vf"])
    dra.allocate(generated, "tpl", uid, [_result("vf", DRIVER, pool, "vf-t")])
    netns, early = dra.add("tpl", uid)  # the controller has not reported the claim yet
    error = json.loads(early.stdout)
    assert early.returncode == 1 and error["code"] == 11, early.stdout
    assert "no ResourceClaim generated yet for claim 'vf'" in error["msg"]
    assert dra.node.links(netns) == ["lo"]

    dra.cluster.merge_patch(
        f"/api/v1/namespaces/{dra.namespace}/pods/tpl/status",
        {"status": {"resourceClaimStatuses": [{"name": "vf", "resourceClaimName": generated}]}},
    )
    deadline = time.monotonic() + 30
    while True:  # until the pod informer has the status (a refused ADD attaches nothing)
        _, done = dra.add("tpl", uid)
        if done.returncode == 0 or "not generated" not in done.stdout:
            break
        assert time.monotonic() < deadline, "pod status never reached the daemon"
        time.sleep(0.2)

    assert done.returncode == 0, done.stdout + done.stderr
    assert dra.recorded() == [("net1", "0000:3b:03.1")]
    (status,) = dra.devices_status(generated)
    assert status["networkData"]["ips"] == ["10.77.0.7/24"]


def test_claim_and_device_plugin_devices_in_one_pod(dra: DraNode) -> None:
    """A pod with a DRA VF and a device-plugin VF (a fake kubelet's PodResources)."""
    pool = dra.publish(DRIVER, {"vf-d": _vf("0000:3b:04.1")})
    dra.vf_nad("vf-dra", "10.77.0.8/24")
    dra.vf_nad("vf-dp", "10.78.0.8/24", resource="intel.com/sriov_dp")
    dra.claim("mixed", ["vf"])
    uid = dra.claim_pod("mix", "vf-dra, vf-dp", [{"name": "vf", "resourceClaimName": "mixed"}])
    dra.allocate("mixed", "mix", uid, [_result("vf", DRIVER, pool, "vf-d")])
    sock = dra.node.root / "fake-kubelet.sock"
    allocations = {(dra.namespace, "mix"): {"app": {"intel.com/sriov_dp": ["0000:5e:00.3"]}}}

    with serve(sock, allocations) as kubelet:
        _, done = dra.add("mix", uid, podResourcesSocket=str(sock))

    assert done.returncode == 0, done.stdout + done.stderr
    assert kubelet.calls == 1  # for the device-plugin resource only
    assert dra.recorded() == [("net1", "0000:3b:04.1"), ("net2", "0000:5e:00.3")]
    assert [s["networkData"]["interfaceName"] for s in dra.devices_status("mixed")] == ["net1"]


def test_claim_errors_name_the_problem(dra: DraNode) -> None:
    pool = dra.publish(DRIVER, {"vf-e": _vf("0000:3b:05.1", resource="intel.com/other")})
    dra.vf_nad("vf-net", "10.77.0.9/24")
    dra.claim("pending", ["vf"])
    pending = dra.claim_pod("p-pending", "vf-net", [{"name": "vf", "resourceClaimName": "pending"}])
    missing = dra.claim_pod("p-missing", "vf-net", [{"name": "vf", "resourceClaimName": "nope"}])
    dra.claim("other", ["vf"])
    other = dra.claim_pod("p-other", "vf-net", [{"name": "vf", "resourceClaimName": "other"}])
    dra.allocate("other", "p-other", other, [_result("vf", DRIVER, pool, "vf-e")])
    dra.claim("wiped", ["vf"])  # its device's slice is gone, as after a kubelet restart
    wiped = dra.claim_pod("p-wiped", "vf-net", [{"name": "vf", "resourceClaimName": "wiped"}])
    dra.allocate("wiped", "p-wiped", wiped, [_result("vf", DRIVER, pool, "vf-unpublished")])
    sock = dra.node.root / "fake-kubelet.sock"

    cases = [
        (
            "p-pending",
            pending,
            11,
            f"ResourceClaim {dra.namespace}/pending (claim 'vf' of pod p-pending) is not allocated",
        ),
        (
            "p-missing",
            missing,
            11,
            f"ResourceClaim {dra.namespace}/nope (claim 'vf' of pod p-missing) does not exist",
        ),
        ("p-other", other, 7, f"no {RESOURCE} device left for pod {dra.namespace}/p-other"),
        (
            "p-wiped",
            wiped,
            11,
            f"ResourceClaim {dra.namespace}/wiped (claim 'vf' of pod p-wiped): device "
            f"vf-unpublished of pool {pool} ({DRIVER}) is in no ResourceSlice",
        ),
    ]
    with serve(sock, {}):
        for pod, uid, code, message in cases:
            netns, done = dra.add(pod, uid, podResourcesSocket=str(sock))
            error = json.loads(done.stdout)
            assert (done.returncode, error["code"]) == (1, code), done.stdout
            assert message in error["msg"]
            assert dra.node.links(netns) == ["lo"]
    assert dra.recorded() == []
    assert "status" not in dra.claim_obj("other") or not dra.devices_status("other")


def test_thin_mode_lists_the_driver_slices_and_writes_at_once(dra: DraNode) -> None:
    """Without informers (thin mode): the slices come from a LIST by driver, and the
    status is written within the call, no background queue."""
    pool = dra.publish(DRIVER, {"vf-thin": _vf("0000:3b:06.1")})
    dra.claim("thin", ["vf"])
    uid = dra.claim_pod("p-thin", "", [{"name": "vf", "resourceClaimName": "thin"}])
    dra.allocate("thin", "p-thin", uid, [_result("vf", DRIVER, pool, "vf-thin")])
    claims = KubeClaims(KubeAPI(str(dra.cluster.kubeconfig)), "", 2.0, None, watch_slices=False)
    pod = Pod(
        namespace=dra.namespace,
        name="p-thin",
        uid=uid,
        resource_claims=[PodClaim(name="vf", claim="thin")],
    )

    (device,) = claims.claim_devices(pod)

    assert (device.device, device.device_id, device.resource_name) == (
        "vf-thin",
        "0000:3b:06.1",
        RESOURCE,
    )
    entry = {
        "driver": DRIVER,
        "pool": pool,
        "device": "vf-thin",
        "networkData": {"interfaceName": "net1"},
    }
    claims.set_device_status(dra.namespace, "thin", device.uid, [entry])
    assert [s["networkData"] for s in dra.devices_status("thin")] == [{"interfaceName": "net1"}]
    # A write meant for an older claim of that name (its UID) never lands on this one.
    stale = {**entry, "networkData": {"interfaceName": "net9"}}
    claims.set_device_status(dra.namespace, "thin", "uid-of-an-older-claim", [stale])
    assert [s["networkData"] for s in dra.devices_status("thin")] == [{"interfaceName": "net1"}]


def test_daemon_cluster_role_allows_the_claim_reads_and_status_write(cluster: Cluster) -> None:
    """crds/plexus-rbac.yaml, asked of the real RBAC authorizer (SubjectAccessReview)."""
    for doc in yaml.safe_load_all((REPO / "crds" / "plexus-rbac.yaml").read_text()):
        cluster.apply(doc)
    user = "system:serviceaccount:kube-system:plexus"
    wanted = [
        ("get", "resourceclaims", ""),
        ("list", "resourceclaims", ""),
        ("watch", "resourceclaims", ""),
        ("patch", "resourceclaims", "status"),
        ("get", "resourceslices", ""),
        ("list", "resourceslices", ""),
        ("watch", "resourceslices", ""),
    ]
    for verb, resource, sub in wanted:
        review = cluster.create(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": user,
                    "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system"],
                    "resourceAttributes": {
                        "group": "resource.k8s.io",
                        "resource": resource,
                        "subresource": sub,
                        "verb": verb,
                        "namespace": "default",
                    },
                },
            },
        )
        assert review["status"].get("allowed") is True, (verb, resource, sub, review["status"])

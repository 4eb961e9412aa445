"""The DRA kubelet plugin (driver sriov.plexus.io) against a real kubelet v1.34.

`plexus deviceplugin --dra-resources` on a FAKE sysfs (tests/unit/deviceplugin/fake_sysfs.py;
the host has no SR-IOV) registers through the kubelet's plugin watcher and publishes its
VFs as ResourceSlices in the real kube-apiserver. No scheduler runs, so the test does what
Kubernetes' own node e2e does without one: it allocates the claim itself (status.allocation,
reservedFor the pod, the delete-protection finalizer) and binds the pod to the node; the
kubelet then calls NodePrepareResources before the pod starts and NodeUnprepareResources
after it is gone. With the Plexus daemon as the node's CNI, a pod whose networks include a
NAD of the pool's resource gets its claim's VF: the deviceID goes to the NAD's sriov
delegate (a FAKE standing in for sriov-cni, since no VF of a fake sysfs can move) and the
claim gets networkData; after the pod's deletion the claim is unprepared and the DEL
released it all. A kubelet restart wipes the node's slices; the plugin publishes them
again. Last, with kube-controller-manager (its ResourceClaim controller) and
kube-scheduler built from the same modules, a pod with a ResourceClaimTemplate gets its
claim made, allocated from our slices and reserved by the real scheduler, then prepared by
the kubelet and attached by the daemon the same way.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.apiserver import CONTROLLERS, REPO, ApiError, Cluster, audit_events, binary
from tests.cluster.kubelet import DevicePlugin, KubeletNode, create_nad, network_status
from tests.netns.test_device_ids import RECORDER

DRIVER = "sriov.plexus.io"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims"
TEMPLATES = "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates"
DELETE_PROTECTION = "resource.kubernetes.io/delete-protection"
PF = "0000:5e:00.0"
VFS = ["0000:5e:02.0", "0000:5e:02.1"]
DEVICE_IDS = {f"vf-{a.replace(':', '-').replace('.', '-')}": a for a in VFS}
RESOURCE_NAME = "dra_vfs"
RESOURCE = f"intel.com/{RESOURCE_NAME}"
BY_RESOURCE = f'device.attributes["k8s.cni.cncf.io"].resourceName == "{RESOURCE}"'

Json = dict[str, Any]


class DraPlugin(DevicePlugin):
    """The device plugin process with its one resource moved to DRA."""

    def __init__(self, kn: KubeletNode) -> None:
        self.cdi_dir = kn.root / "cdi"
        self.state_dir = kn.root / "dra-state"
        super().__init__(
            kn,
            RESOURCE_NAME,
            PF,
            VFS,
            registration="watcher",
            extra_args=[
                "--dra-resources", RESOURCE,
                "--node-name", kn.name,
                "--kubeconfig", str(kn.cluster.kubeconfig),
                "--kubelet-plugins-dir", str(kn.kubelet.root_dir / "plugins"),
                "--cdi-dir", str(self.cdi_dir),
                "--dra-state-dir", str(self.state_dir),
            ],
        )  # fmt: skip

    @property
    def pool(self) -> str:
        return f"{self.kn.name}/intel.com/dra-vfs"


@pytest.fixture(scope="module")
def dra(kubelet_node: KubeletNode) -> Iterator[DraPlugin]:
    kubelet_node.cluster.apply(yaml.safe_load((REPO / "crds/sriov-deviceclass.yaml").read_text()))
    plugin = DraPlugin(kubelet_node)
    plugin.start()
    try:
        yield plugin
    finally:
        assert plugin.stop() == 0, plugin.log.read_text()[-3000:]


def node_slices(cluster: Cluster, node: str) -> list[Json]:
    query = {"fieldSelector": f"spec.nodeName={node},spec.driver={DRIVER}"}
    items: list[Json] = cluster.get(SLICES, query=query)["items"]
    return items


def wait_slices(dra: DraPlugin, other_than: frozenset[str] = frozenset()) -> list[Json]:
    """Until the node has its slice (none of the UIDs in `other_than`); return them."""
    found: list[Json] = []

    def ready() -> bool:
        found[:] = node_slices(dra.kn.cluster, dra.kn.name)
        return bool(found) and not {s["metadata"]["uid"] for s in found} & other_than

    dra.kn.wait_for("the node's ResourceSlices", ready, dra.log)
    return found


def test_registers_with_the_kubelet_and_publishes_one_device_per_vf(dra: DraPlugin) -> None:
    kn = dra.kn
    dra.kn.wait_for("DRA registration", lambda: dra.registrations() >= 1, dra.log)
    (slice_,) = wait_slices(dra)
    spec = slice_["spec"]
    assert spec["driver"] == DRIVER and spec["nodeName"] == kn.name
    assert spec["pool"]["name"] == dra.pool and spec["pool"]["resourceSliceCount"] == 1
    devices = {d["name"]: d["attributes"] for d in spec["devices"]}
    assert sorted(devices) == ["vf-0000-5e-02-0", "vf-0000-5e-02-1"]
    attrs = devices["vf-0000-5e-02-1"]
    assert attrs["k8s.cni.cncf.io/resourceName"] == {"string": RESOURCE}
    assert attrs["k8s.cni.cncf.io/deviceID"] == {"string": "0000:5e:02.1"}
    assert attrs["pfName"] == {"string": kn.node.uplink}
    assert attrs["numaNode"] == {"int": 0}
    assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": "pci0000:00"}
    node = kn.node_object()
    assert node is not None
    (owner,) = slice_["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"]) == (
        "Node",
        kn.name,
        node["metadata"]["uid"],
    )


def claim_manifest(name: str) -> Json:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "finalizers": [DELETE_PROTECTION]},
        "spec": {"devices": {"requests": [{"name": "vf", "exactly": {"deviceClassName": DRIVER}}]}},
    }


def allocate(dra: DraPlugin, namespace: str, claim: str, device: str, pod: Json) -> Json:
    """What the scheduler would write: the allocation on this node and the reservation."""
    path = f"{CLAIMS.format(ns=namespace)}/{claim}"
    obj: Json = dra.kn.cluster.get(path)
    node_term = {
        "matchFields": [{"key": "metadata.name", "operator": "In", "values": [dra.kn.name]}]
    }
    obj["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "vf", "driver": DRIVER, "pool": dra.pool, "device": device}
                ],
                "config": [
                    {
                        "source": "FromClaim",
                        "requests": ["vf"],
                        "opaque": {"driver": DRIVER, "parameters": {}},
                    }
                ],
            },
            "nodeSelector": {"nodeSelectorTerms": [node_term]},
        },
        "reservedFor": [
            {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
        ],
    }
    updated: Json = dra.kn.cluster.request("PUT", f"{path}/status", obj)
    return updated


def pod_with_claim(kn: KubeletNode, name: str, claim: str, networks: str = "") -> Json:
    """A pod for the node (bound later, as the scheduler would) using `claim`, attached
    to `networks` (the annotation) if given."""
    pod = kn.pod_manifest(name, networks)
    del pod["spec"]["nodeName"]
    if not networks:
        del pod["metadata"]["annotations"]
    pod["spec"]["resourceClaims"] = [{"name": "vf", "resourceClaimName": claim}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "vf"}]}
    return pod


def bind(kn: KubeletNode, namespace: str, name: str) -> None:
    kn.cluster.create(
        f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
        {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": kn.name},
        },
    )


def release(cluster: Cluster, namespace: str, claim: str) -> None:
    """Drop the finalizer and delete the claim (the controller's part, which is not running)."""
    path = f"{CLAIMS.format(ns=namespace)}/{claim}"
    try:
        cluster.merge_patch(path, {"metadata": {"finalizers": None}})
        cluster.request("DELETE", path)
    except ApiError as err:
        if err.status != 404:
            raise


def test_pod_with_claim_is_prepared_and_unprepared_across_a_plugin_restart(
    dra: DraPlugin, namespace: str
) -> None:
    kn = dra.kn
    dra.kn.wait_for("DRA registration", lambda: dra.registrations() >= 1, dra.log)
    wait_slices(dra)
    claim_name = f"vf-{uuid.uuid4().hex[:6]}"
    claim = kn.cluster.create(CLAIMS.format(ns=namespace), claim_manifest(claim_name))
    claim_uid = claim["metadata"]["uid"]
    try:
        pod = kn.cluster.create(
            f"/api/v1/namespaces/{namespace}/pods", pod_with_claim(kn, "dra-pod", claim_name)
        )
        allocate(dra, namespace, claim_name, "vf-0000-5e-02-1", pod)
        bind(kn, namespace, "dra-pod")
        kn.wait_running(namespace, "dra-pod")
        # One read of the claim, as the pod's bind showed it to the plugin (consistent), and
        # none by Prepare: it took that copy.
        assert dra.proc is not None
        plugin_requests = audit_events(kn.cluster.audit_log, f"plexus/{dra.proc.pid}")
        assert [
            e["requestURI"]
            for e in plugin_requests
            if e["verb"] == "get" and e["objectRef"].get("name") == claim_name
        ] == [f"{CLAIMS.format(ns=namespace)}/{claim_name}"]

        spec_file = dra.cdi_dir / f"sriov.plexus.io-claim_{claim_uid}.json"
        spec = json.loads(spec_file.read_text())
        assert spec["kind"] == "sriov.plexus.io/vf"
        (device,) = spec["devices"]
        assert device["name"] == f"{claim_uid}-vf-0000-5e-02-1"
        assert device["containerEdits"]["env"] == ["PCIDEVICE_INTEL_COM_DRA_VFS=0000:5e:02.1"]
        assert device["containerEdits"]["deviceNodes"] == []  # a netdevice VF: no /dev nodes
        state = json.loads((dra.state_dir / f"{claim_uid}.json").read_text())
        assert [(d["address"], d["cdi_id"]) for d in state["devices"]] == [
            ("0000:5e:02.1", f"sriov.plexus.io/vf={claim_uid}-vf-0000-5e-02-1")
        ]
        assert "prepared" in dra.log.read_text()

        # A new plugin instance (an upgrade, a crash) takes over from the state on disk:
        # its Unprepare undoes what the old one prepared.
        registrations = dra.registrations()
        assert dra.stop() == 0
        dra.start()
        kn.wait_for("the new instance's registration", lambda: dra.registrations() > registrations)
        kn.delete_pod(namespace, "dra-pod")
        kn.wait_for(
            "NodeUnprepareResources to remove the CDI spec and the prepared state",
            lambda: not spec_file.exists() and not (dra.state_dir / f"{claim_uid}.json").exists(),
            dra.log,
        )
    finally:
        release(kn.cluster, namespace, claim_name)


class FakeSriov:
    """The NAD's sriov delegate: a FAKE (the recorder of tests/netns/test_device_ids.py,
    installed as `fake-sriov` in the node's CNI bin dir), since no VF netdevice of a fake
    sysfs can move into a pod. It logs each call's stdin and returns `address` on
    `CNI_IFNAME` with the recorder's MAC, as sriov-cni would report the VF."""

    MAC = "02:00:00:00:00:01"

    def __init__(self, kn: KubeletNode, address: str) -> None:
        self.kn = kn
        self.address = address
        self.record = kn.root / f"fake-sriov-{uuid.uuid4().hex[:6]}.jsonl"
        plugin = kn.node.bin / "fake-sriov"
        plugin.write_text(RECORDER)
        plugin.chmod(0o755)

    def nad(self, namespace: str, name: str) -> None:
        """A NAD of the DRA pool's resource whose delegate is this fake."""
        config = {
            "cniVersion": "1.0.0",
            "name": name,
            "type": "fake-sriov",
            "record": str(self.record),
            "address": self.address,
        }
        create_nad(self.kn.cluster, namespace, name, config, resource=RESOURCE)

    def calls(self) -> list[Json]:
        """{cmd, ifname, conf} of every call, in order."""
        lines = self.record.read_text().splitlines() if self.record.exists() else []
        return [json.loads(line) for line in lines]


def claim_status(kn: KubeletNode, namespace: str, claim: str) -> Json:
    """The claim once Plexus has written its status.devices (in the background)."""
    path = f"{CLAIMS.format(ns=namespace)}/{claim}"
    found: Json = {}

    def written() -> bool:
        found.update(kn.cluster.get(path))
        return bool(found.get("status", {}).get("devices"))

    kn.wait_for(f"status.devices of ResourceClaim {namespace}/{claim}", written)
    return found


def check_attached(
    dra: DraPlugin, fake: FakeSriov, namespace: str, pod: Json, claim: str, device: str
) -> tuple[str, str, list[str]]:
    """The claim's VF reached the fake sriov delegate and networkData the claim; return the
    pod's sandbox ID, netns and IPs."""
    kn = dra.kn
    (add,) = [c for c in fake.calls() if c["cmd"] == "ADD"]
    assert add["ifname"] == "net1"
    assert add["conf"]["deviceID"] == add["conf"]["pciBusID"] == DEVICE_IDS[device]

    entries = network_status(kn, namespace, pod["metadata"]["name"])
    assert [(e["name"], e["interface"]) for e in entries] == [
        ("default-net", "eth0"),
        (f"{namespace}/vf-net", "net1"),
    ]
    assert (entries[1]["ips"], entries[1]["mac"]) == (
        [fake.address.split("/")[0]],
        FakeSriov.MAC,
    )
    # The DRA plugin's device-info file, as the device plugin writes one for its VFs.
    assert entries[1]["device-info"] == {
        "type": "pci",
        "version": "1.1.0",
        "pci": {"pci-address": DEVICE_IDS[device], "pf-pci-address": PF},
    }
    obj = claim_status(kn, namespace, claim)
    (status,) = obj["status"]["devices"]
    assert (status["driver"], status["pool"], status["device"]) == (DRIVER, dra.pool, device)
    assert status["networkData"] == {
        "interfaceName": "net1",
        "ips": [fake.address],
        "hardwareAddress": FakeSriov.MAC,
    }
    (ready,) = status["conditions"]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "True", "NetworkAttached")
    managers = [
        (m["manager"], m["operation"], m.get("subresource"))
        for m in obj["metadata"]["managedFields"]
    ]
    assert ("plexus", "Apply", "status") in managers

    (sandbox,) = kn.sandboxes(pod["metadata"]["uid"], ready_only=True)
    netns = kn.sandbox_netns(sandbox.id)
    assert sandbox.id in kn.records()
    return sandbox.id, netns, entries[0]["ips"]


def check_released(
    dra: DraPlugin, fake: FakeSriov, claim_uid: str, sandbox: tuple[str, str, list[str]]
) -> None:
    """After the pod's deletion: the kubelet unprepared the claim and the daemon's DEL
    reached the fake delegate and released the sandbox's record and IPs."""
    kn = dra.kn
    sandbox_id, netns, ips = sandbox
    spec_file = dra.cdi_dir / f"sriov.plexus.io-claim_{claim_uid}.json"
    kn.wait_for(
        "NodeUnprepareResources to remove the CDI spec and the prepared state",
        lambda: not spec_file.exists() and not (dra.state_dir / f"{claim_uid}.json").exists(),
        dra.log,
    )
    assert "DEL" in [c["cmd"] for c in fake.calls()]
    assert sandbox_id not in kn.records()
    assert not list((kn.devinfo_dir / "cni").glob(f"*{sandbox_id}*"))  # the attachment's copy
    assert not set(ips) & set(kn.node.reserved_ips())
    assert not Path(netns).exists(), f"{netns} still exists"


def vf_network(dra: DraPlugin, namespace: str, address: str) -> FakeSriov:
    """Once the plugin is registered and its slices are out: NAD `vf-net` of the pool's
    resource, whose fake sriov delegate answers with `address`."""
    dra.kn.wait_for("DRA registration", lambda: dra.registrations() >= 1, dra.log)
    wait_slices(dra)
    fake = FakeSriov(dra.kn, address)
    fake.nad(namespace, "vf-net")
    return fake


def test_claim_vf_reaches_the_sriov_delegate_and_network_data_the_claim(
    dra: DraPlugin, namespace: str
) -> None:
    kn = dra.kn
    fake = vf_network(dra, namespace, "10.96.0.5/24")
    records_before, reserved_before = kn.records(), kn.node.reserved_ips()
    claim_name = f"vf-{uuid.uuid4().hex[:6]}"
    claim = kn.cluster.create(CLAIMS.format(ns=namespace), claim_manifest(claim_name))
    try:
        manifest = pod_with_claim(kn, "attached", claim_name, networks="vf-net")
        pod = kn.cluster.create(f"/api/v1/namespaces/{namespace}/pods", manifest)
        allocate(dra, namespace, claim_name, "vf-0000-5e-02-0", pod)
        bind(kn, namespace, "attached")
        kn.wait_running(namespace, "attached")

        sandbox = check_attached(dra, fake, namespace, pod, claim_name, "vf-0000-5e-02-0")
        # A kubelet restart (which wipes the node's slices) leaves the attached pod alone,
        # and the new kubelet unprepares it from its checkpoint.
        before = {s["metadata"]["uid"] for s in wait_slices(dra)}
        kn.restart_kubelet()
        kn.wait_node_ready()
        wait_slices(dra, other_than=frozenset(before))
        assert [c["cmd"] for c in fake.calls()] == ["ADD"]

        kn.delete_pod(namespace, "attached")
        check_released(dra, fake, claim["metadata"]["uid"], sandbox)
        assert kn.records() == records_before
        assert kn.node.reserved_ips() == reserved_before
        # DEL leaves the claim's status alone; deallocating it (the controller's part once
        # the pod is gone) makes the API server drop the device's entry.
        path = f"{CLAIMS.format(ns=namespace)}/{claim_name}"
        obj = kn.cluster.get(path)
        assert [d["device"] for d in obj["status"]["devices"]] == ["vf-0000-5e-02-0"]
        obj["status"] = {}
        deallocated = kn.cluster.request("PUT", f"{path}/status", obj)
        assert "devices" not in deallocated.get("status", {}), deallocated["status"]
    finally:
        release(kn.cluster, namespace, claim_name)


def test_kubelet_restart_wipes_slices_and_the_plugin_publishes_them_again(
    dra: DraPlugin,
) -> None:
    kn = dra.kn
    dra.kn.wait_for("DRA registration", lambda: dra.registrations() >= 1, dra.log)
    before = {s["metadata"]["uid"] for s in wait_slices(dra)}
    registrations = dra.registrations()
    kn.restart_kubelet()
    kn.wait_node_ready()
    # New UIDs: the kubelet deleted the old slices and the plugin created them anew.
    (again,) = wait_slices(dra, other_than=frozenset(before))
    assert sorted(d["name"] for d in again["spec"]["devices"]) == [
        "vf-0000-5e-02-0",
        "vf-0000-5e-02-1",
    ]
    kn.wait_for(
        "the plugin watcher to register the plugin again",
        lambda: dra.registrations() > registrations,
        dra.log,
    )


@pytest.fixture
def scheduler(cluster: Cluster) -> Iterator[None]:
    """kube-controller-manager and kube-scheduler, unless the session already runs them."""
    missing = [str(binary(n)) for n in CONTROLLERS if not binary(n).exists()]
    if missing:
        pytest.skip(f"{', '.join(missing)} not built (run make setup)")
    started = "kube-scheduler" not in cluster.procs
    if started:
        cluster.start_controllers()
    try:
        yield
    finally:
        if started:
            cluster.stop_controllers()


def test_template_claim_is_allocated_by_the_scheduler_prepared_and_attached(
    dra: DraPlugin, namespace: str, scheduler: None
) -> None:
    kn = dra.kn
    fake = vf_network(dra, namespace, "10.96.0.6/24")
    request = {
        "name": "vf",
        "exactly": {
            "deviceClassName": DRIVER,
            "selectors": [{"cel": {"expression": BY_RESOURCE}}],
        },
    }
    kn.cluster.create(
        TEMPLATES.format(ns=namespace),
        {"metadata": {"name": "one-vf"}, "spec": {"spec": {"devices": {"requests": [request]}}}},
    )
    pod = pod_with_claim(kn, "scheduled", "", networks="vf-net")
    pod["spec"]["resourceClaims"] = [{"name": "vf", "resourceClaimTemplateName": "one-vf"}]
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": kn.name}
    # The kubelet registers its Node with the not-ready taint, which only the node
    # lifecycle controller (not running) would lift.
    pod["spec"]["tolerations"] = [{"operator": "Exists"}]
    kn.cluster.create(f"/api/v1/namespaces/{namespace}/pods", pod)
    running = kn.wait_running(namespace, "scheduled")
    (status,) = running["status"]["resourceClaimStatuses"]
    claim_name = status["resourceClaimName"]
    claim = kn.cluster.get(f"{CLAIMS.format(ns=namespace)}/{claim_name}")
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert (result["driver"], result["pool"]) == (DRIVER, dra.pool)
    assert result["device"] in ("vf-0000-5e-02-0", "vf-0000-5e-02-1")
    assert [r["uid"] for r in claim["status"]["reservedFor"]] == [running["metadata"]["uid"]]
    uid = claim["metadata"]["uid"]
    spec_file = dra.cdi_dir / f"sriov.plexus.io-claim_{uid}.json"
    (device,) = json.loads(spec_file.read_text())["devices"]
    assert device["name"] == f"{uid}-{result['device']}"
    # The daemon found the generated claim through the pod's status.
    sandbox = check_attached(dra, fake, namespace, running, claim_name, result["device"])

    kn.delete_pod(namespace, "scheduled")
    check_released(dra, fake, uid, sandbox)

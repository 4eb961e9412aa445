"""The SR-IOV provisioning CRDs on the test cluster, and builders of their objects."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import yaml

from deviceplugin.config import ResourceConfig
from deviceplugin.provision.agent import ProvisionAgent, ProvisionOptions
from deviceplugin.provision.holders import AllocationReader, KubeletAllocation
from deviceplugin.provision.node import NodeProvisioner
from deviceplugin.provision.record import Records
from deviceplugin.sysfs import discover
from kube.api import KubeAPI
from tests.cluster.apiserver import REPO, ApiError, Cluster
from tests.unit.deviceplugin.fake_kernel import FakeKernel
from tests.unit.deviceplugin.fake_sysfs import FakeSysfs

CRDS = REPO / "crds" / "sriovnetwork-crds.yaml"
PROVISIONING = REPO / "crds" / "plexus-sriov-provisioning.yaml"
NAMESPACE = "sriov-network-operator"
GROUP_VERSION = "sriovnetwork.openshift.io/v1"
POLICIES = f"/apis/{GROUP_VERSION}/namespaces/{NAMESPACE}/sriovnetworknodepolicies"
STATES = f"/apis/{GROUP_VERSION}/namespaces/{NAMESPACE}/sriovnetworknodestates"
POOLS = f"/apis/{GROUP_VERSION}/namespaces/{NAMESPACE}/sriovnetworkpoolconfigs"
NETWORKS = f"/apis/{GROUP_VERSION}/namespaces/{{ns}}/sriovnetworks"
NADS = "/apis/k8s.cni.cncf.io/v1/namespaces/{ns}/network-attachment-definitions"
HOLDS = "test.plexus.io/holds"  # FakeKubeletDevices: resource -> VFs a pod holds
PF = "0000:3b:00.0"

Json = dict[str, Any]


def install(cluster: Cluster) -> None:
    """Apply crds/sriovnetwork-crds.yaml and the provisioning RBAC; wait until served."""
    crds = [d for d in yaml.safe_load_all(CRDS.read_text()) if d]
    for doc in crds:
        cluster.apply(doc)
    for doc in yaml.safe_load_all(PROVISIONING.read_text()):
        if doc:
            cluster.apply(doc)
    for doc in crds:
        cluster._wait_crd_served(doc["metadata"]["name"])
    cluster.create_namespace("kube-system")


def policy(name: str, **spec: Any) -> Json:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "SriovNetworkNodePolicy",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


def pool_config(name: str, max_unavailable: int | str | None, labels: dict[str, str]) -> Json:
    spec: Json = {"nodeSelector": {"matchLabels": labels}}
    if max_unavailable is not None:
        spec["maxUnavailable"] = max_unavailable
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "SriovNetworkPoolConfig",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": spec,
    }


def network(name: str, namespace: str = NAMESPACE, **spec: Any) -> Json:
    return {
        "apiVersion": GROUP_VERSION,
        "kind": "SriovNetwork",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


def service_account_kubeconfig(cluster: Cluster, path: Path) -> Path:
    """A kubeconfig whose user is the device plugin's ServiceAccount, which the provisioning
    RBAC binds (a client certificate with its username: RBAC matches by name)."""
    pem = cluster.client_certificate(
        f"prov-{uuid.uuid4().hex[:6]}",
        "system:serviceaccount:kube-system:plexus-deviceplugin",
        ["system:serviceaccounts"],
    )
    return cluster.kubeconfig_of(pem, path)


class FakeKubeletDevices:
    """FAKE kubelet device manager (these nodes run no kubelet): a pod bound to the node holds
    the VFs its annotation HOLDS names, under `resource`, until its deletion has begun."""

    def __init__(self, cluster: Cluster, node: str) -> None:
        self.cluster, self.node = cluster, node

    def __call__(self) -> list[KubeletAllocation]:
        pods = self.cluster.get(
            "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={self.node}"}
        )
        out = []
        for pod in pods["items"]:
            meta = pod["metadata"]
            held = json.loads((meta.get("annotations") or {}).get(HOLDS, "{}"))
            if meta.get("deletionTimestamp"):
                continue
            for resource, vfs in held.items():
                out.append(
                    KubeletAllocation(meta["namespace"], meta["name"], "", resource, tuple(vfs))
                )
        return out


class AgentNode:
    """A Node object, a FAKE kernel with one igb-like PF (fake_kernel.py: no SR-IOV on this
    host), and the real agent on it, with the device plugin's ServiceAccount rights."""

    def __init__(self, cluster: Cluster, root: Path, name: str, labels: dict[str, str]) -> None:
        self.cluster, self.name = cluster, name
        cluster.create("/api/v1/nodes", {"metadata": {"name": name, "labels": labels}})
        root.mkdir(parents=True)
        self.kernel = FakeKernel(FakeSysfs(root / "sys"))
        self.kernel.add_pf(PF, "ens1f0")
        self.published: list[list[ResourceConfig]] = []
        provisioner = NodeProvisioner(
            self.kernel,
            Records(root / "records"),
            AllocationReader(FakeKubeletDevices(cluster, name), None),
        )
        options = ProvisionOptions(
            node_name=name,
            namespace=NAMESPACE,
            resync_seconds=5,
            retry_seconds=0.2,
            lease_seconds=15,
        )
        api = KubeAPI(str(service_account_kubeconfig(cluster, root / "kubeconfig")))
        self.agent = ProvisionAgent(api, options, provisioner, self.published.append)

    def vfs(self) -> dict[str, str]:
        """VF address -> driver, on the FAKE kernel."""
        return {d.address: d.driver for d in discover(self.kernel.root) if d.is_vf}

    def state(self) -> Json:
        return dict(self.cluster.get(f"{STATES}/{self.name}"))

    def pool(self, resource: str) -> list[str]:
        """The VFs the agent last gave the device plugin for `resource`."""
        found = [r for r in self.published[-1] if r.full_name == resource] if self.published else []
        return [a for r in found for s in r.selectors for a in s.pci_addresses]

    def close(self) -> None:
        self.agent.stop()
        for path in (f"{STATES}/{self.name}", f"/api/v1/nodes/{self.name}"):
            try:
                self.cluster.request("DELETE", path)
            except ApiError as err:
                if err.status != 404:
                    raise


def run_pod(
    cluster: Cluster,
    namespace: str,
    name: str,
    node: str,
    holds: dict[str, list[str]],
    labels: dict[str, str] | None = None,
) -> None:
    """A pod bound to `node`, holding VFs for FakeKubeletDevices, and reported Running and
    Ready as a kubelet would (FAKE: no kubelet runs; PDBs only protect running pods)."""
    manifest = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": labels or {},
            "annotations": {HOLDS: json.dumps(holds)},
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    pods = f"/api/v1/namespaces/{namespace}/pods"
    cluster.create(pods, manifest)
    running = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
    cluster.merge_patch(f"{pods}/{name}/status", {"status": running})

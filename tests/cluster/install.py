"""Plexus installed on the two-node tier's nodes the way users install it.

The image is built from the repo's Containerfile by scripts/build-image.sh (no registry:
a Debian base, buildah) and imported into each node's containerd; crds/ is installed with
`kubectl apply -k` of an overlay written here as a user writes one (overlays/example):
`images` set to the built tag (already imported, so `IfNotPresent` never pulls), and,
for what a test installs on its own, hostPaths moved or objects left out. kubectl is the
one built with the cluster (scripts/build-go-tools.sh). The kubelets then run the
DaemonSet's pods, whose hostPaths land on each node's own dirs (tests/cluster/mounts.py).
In-cluster clients dial the `kubernetes` Service's ClusterIP; with no kube-proxy, a relay
in each node namespace answers there. `uninstall()` removes it as docs/install.md says:
`kubectl delete -k` the overlay, then an overlay of crds/uninstall applied until ready on
every node and deleted.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from cri_api.v1 import api_pb2 as cri

from tests.cluster.apiserver import REPO, SERVICE_IP, ApiError, Cluster, binary
from tests.cluster.forward import LoopbackForward
from tests.cluster.kubelet import NETNS_DIR, KubeletNode, tail
from tests.netns.conftest import sh

BUILD_IMAGE = REPO / "scripts" / "build-image.sh"
KUBECTL = binary("kubectl")
BASE = REPO / "crds"  # the install's kustomize base
UNINSTALL_BASE = BASE / "uninstall"
# Left out of the tier's install: the device plugin's DaemonSet would run on the host's
# /sys; tests/cluster/test_two_nodes_deviceplugin.py installs it on a FAKE sysfs itself.
SEPARATE = [BASE / "plexus-deviceplugin.yaml"]
UNINSTALL_NAME = "plexus-uninstall"  # its DaemonSet
DAEMONSETS = "/apis/apps/v1/namespaces/kube-system/daemonsets"
SHIPPED_IMAGE = "plexus"  # the manifests' `plexus:dev`, by name as kustomize's `images` matches
IMAGE = "localhost/plexus:dev"
BUILD_TIMEOUT = 1800.0

Json = dict[str, Any]


def available() -> bool:
    """Whether this tree can build the image (else Plexus is started by hand)."""
    return BUILD_IMAGE.exists() and (BASE / "kustomization.yaml").exists()


def build_image(tag: str = IMAGE) -> Path:
    """The docker-archive of the image, built (or found in its cache) under `tag`."""
    done = subprocess.run(
        [str(BUILD_IMAGE), tag], capture_output=True, text=True, timeout=BUILD_TIMEOUT
    )
    if done.returncode != 0:
        raise RuntimeError(f"{BUILD_IMAGE.name} {tag} failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def kubectl(cluster: Cluster | None, *args: str, timeout: float = 180) -> str:
    """Run the built kubectl as the cluster's admin (none: no API access); its stdout."""
    config = [f"--kubeconfig={cluster.kubeconfig}"] if cluster is not None else []
    done = subprocess.run(
        [str(KUBECTL), *config, *args], capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def _docs(text: str) -> list[Json]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _identity(doc: Json) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


@contextmanager
def overlay(
    image: str,
    base: Path = BASE,
    host_paths: dict[str, str] | None = None,
    dropped: Sequence[Path] = (),
) -> Iterator[Path]:
    """A throwaway overlay of `base`: `image` for the shipped one, the DaemonSets'
    hostPaths moved (OLD -> NEW), the objects of the `dropped` files left out."""
    name, _, tag = image.rpartition(":")
    patches: list[Json] = []
    if host_paths:
        for doc in _docs(kubectl(None, "kustomize", str(base))):
            if doc["kind"] != "DaemonSet":
                continue
            volumes = [
                {"name": v["name"], "hostPath": {"path": host_paths[v["hostPath"]["path"]]}}
                for v in doc["spec"]["template"]["spec"].get("volumes", [])
                if v.get("hostPath", {}).get("path") in host_paths
            ]
            if volumes:
                patches.append(_patch(doc, {"spec": {"template": {"spec": {"volumes": volumes}}}}))
    for file in dropped:
        patches += [_patch(doc, {"$patch": "delete"}) for doc in _docs(file.read_text())]
    with tempfile.TemporaryDirectory(prefix="pxt-overlay-") as directory:
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [os.path.relpath(base, directory)],
            "images": [{"name": SHIPPED_IMAGE, "newName": name, "newTag": tag}],
            "patches": [{"patch": yaml.safe_dump(patch, sort_keys=False)} for patch in patches],
        }
        (Path(directory) / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        yield Path(directory)


def _patch(doc: Json, body: Json) -> Json:
    """A strategic-merge patch of the object `doc` names."""
    meta = {k: v for k, v in doc["metadata"].items() if k in ("name", "namespace")}
    return {"apiVersion": doc["apiVersion"], "kind": doc["kind"], "metadata": meta, **body}


def manifests(
    image: str, files: Sequence[Path] | None = None, host_paths: dict[str, str] | None = None
) -> list[Json]:
    """The install as an overlay renders it (`kubectl kustomize`), the objects of `files`
    only if given. One copy for all nodes: each node's mount namespace gives the same
    hostPaths its own dirs."""
    with overlay(image, host_paths=host_paths) as directory:
        docs = _docs(kubectl(None, "kustomize", str(directory)))
    if files is None:
        return docs
    wanted = {_identity(doc) for file in files for doc in _docs(file.read_text())}
    return [doc for doc in docs if _identity(doc) in wanted]


def serve_cluster_ip(kn: KubeletNode) -> LoopbackForward:
    """The `kubernetes` Service's ClusterIP:443 in the node namespace -> the apiserver."""
    sh("ip", "addr", "add", f"{SERVICE_IP}/32", "dev", "lo", netns=kn.node.name)
    port = int(kn.cluster.server.rsplit(":", 1)[1])
    forward = LoopbackForward(str(NETNS_DIR / kn.node.name), port, listen=(SERVICE_IP, 443))
    forward.start()
    return forward


def remove_hand_installed(kn: KubeletNode) -> None:
    """The node's CNI bin dir as on a node Plexus was never installed on: without the
    Plexus binaries the test node came with (tests/netns/conftest.py's Node), so the only
    one is the shim the DaemonSet installs (with `plexus-thin` beside it, the shim would
    fall back to it while the daemon is down instead of failing the ADD)."""
    for path in kn.node.bin.glob("plexus*"):
        path.unlink()


def import_image(kn: KubeletNode, archive: Path, image: str) -> None:
    kn.containerd.import_image(archive)
    kn.wait_for(f"containerd to know {image}", lambda: kn.containerd.image_known(image))


def apply(cluster: Cluster, image: str) -> None:
    """`kubectl apply -k` the install's overlay (the device plugin left out: SEPARATE)."""
    with overlay(image, dropped=SEPARATE) as directory:
        kubectl(cluster, "apply", "-k", str(directory))


def daemonset_ready(cluster: Cluster, nodes: int, image: str, name: str = "plexus") -> bool:
    """Whether every node runs an up-to-date, ready pod of the DaemonSet with `image`."""
    ds = cluster.get(f"{DAEMONSETS}/{name}")
    status, spec = ds.get("status", {}), ds["spec"]["template"]["spec"]
    return bool(
        spec["containers"][0]["image"] == image
        and status.get("observedGeneration") == ds["metadata"]["generation"]
        and status.get("updatedNumberScheduled") == nodes
        and status.get("numberReady") == nodes
        and status.get("numberAvailable") == nodes
    )


def wait_daemonset(
    cluster: Cluster, nodes: list[KubeletNode], image: str, name: str = "plexus"
) -> None:
    try:
        nodes[0].wait_for(
            f"the {name} DaemonSet ready on {len(nodes)} nodes with {image}",
            lambda: daemonset_ready(cluster, len(nodes), image, name),
        )
    except AssertionError as err:
        raise AssertionError(f"{err}\n{daemon_logs(nodes)}") from None


def daemon_logs(nodes: list[KubeletNode]) -> str:
    """The tails of the daemon pods' container logs (the kubelet's pod logs dir)."""
    logs = [log for kn in nodes for log in kn.kubelet.root.glob("pod-logs/kube-system_*/*/*.log")]
    return "\n".join(f"--- {log}\n{tail(log, 30)}" for log in sorted(logs))


def delete_daemonset(cluster: Cluster, name: str = "plexus") -> None:
    """Delete a DaemonSet of ours (if still there) and wait until its pods are gone."""
    delete(cluster, f"{DAEMONSETS}/{name}")
    wait_pods_gone(cluster, name)


def wait_pods_gone(cluster: Cluster, name: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        items = cluster.get(
            "/api/v1/namespaces/kube-system/pods", query={"labelSelector": f"app={name}"}
        )["items"]
        if not items:
            return
        time.sleep(0.5)
    raise AssertionError(f"the {name} DaemonSet's pods still exist after 120 s")


def delete(cluster: Cluster, path: str) -> None:
    """DELETE an object and its dependents; one already gone is fine."""
    try:
        cluster.request("DELETE", path, {"propagationPolicy": "Foreground"})
    except ApiError as err:
        if err.status != 404:
            raise


def uninstall(cluster: Cluster, image: str, nodes: list[KubeletNode]) -> None:
    """As docs/install.md says: `kubectl delete -k` the install's overlay (its DaemonSet's
    pods waited out), then the uninstall overlay applied until ready on every node and
    deleted. That deletes the install's CRDs too (the NAD CRD: every NAD): the session's
    cluster gets them back after, as the `cluster` fixture promises the NAD CRD."""
    with overlay(image, dropped=SEPARATE) as directory:
        kubectl(cluster, "delete", "-k", str(directory), "--wait=true", "--ignore-not-found")
    wait_pods_gone(cluster, "plexus")
    with overlay(image, base=UNINSTALL_BASE) as directory:
        kubectl(cluster, "apply", "-k", str(directory))
        wait_daemonset(cluster, nodes, image, UNINSTALL_NAME)
        kubectl(cluster, "delete", "-k", str(directory), "--wait=true", "--ignore-not-found")
    wait_pods_gone(cluster, UNINSTALL_NAME)
    crds = [d for d in manifests(image) if d["kind"] == "CustomResourceDefinition"]
    for crd in crds:
        cluster.apply(crd)
    for crd in crds:  # after all the applies: their settling overlaps
        cluster._wait_crd_served(crd["metadata"]["name"])


def set_image(cluster: Cluster, image: str) -> None:
    """The upgrade: the install's overlay applied again with another image."""
    apply(cluster, image)


def daemon_pods(cluster: Cluster) -> list[Json]:
    """The daemon's pods (a node may have two during an upgrade: old and new)."""
    items: list[Json] = cluster.get(
        "/api/v1/namespaces/kube-system/pods", query={"labelSelector": "app=plexus"}
    )["items"]
    return items


def daemon_pod(cluster: Cluster, kn: KubeletNode) -> Json:
    """The node's one daemon pod."""
    (pod,) = [p for p in daemon_pods(cluster) if p["spec"].get("nodeName") == kn.name]
    return pod


def daemon_pid(kn: KubeletNode) -> int:
    """The host PID of the node's running daemon container (from containerd)."""
    uid = daemon_pod(kn.cluster, kn)["metadata"]["uid"]
    (sandbox,) = kn.sandboxes(uid, ready_only=True)
    (container,) = [
        c
        for c in kn.containers(sandbox.id)
        if c.metadata.name == "plexus" and c.state == cri.ContainerState.CONTAINER_RUNNING
    ]
    done: cri.ContainerStatusResponse = kn.containerd.runtime.ContainerStatus(
        cri.ContainerStatusRequest(container_id=container.id, verbose=True), timeout=30
    )
    return int(json.loads(done.info["info"])["pid"])

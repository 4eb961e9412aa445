"""Plexus installed on the two-node tier's nodes the way users install it.

The image is built from the repo's Containerfile by scripts/build-image.sh (no registry:
a Debian base, buildah) and imported into each node's containerd; crds/ is applied as
shipped through its documented overlay, which changes only the image (to the built tag,
already imported, so `IfNotPresent` never pulls). The kubelets then run the DaemonSet's
pods, whose hostPaths land on each node's own dirs (tests/cluster/mounts.py). In-cluster
clients dial the `kubernetes` Service's ClusterIP; with no kube-proxy, a relay in each
node namespace answers there. `uninstall()` removes it as the README says: the manifests
deleted, then crds/plexus-uninstall.yaml run once on every node.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from cri_api.v1 import api_pb2 as cri

from tests.cluster.apiserver import REPO, SERVICE_IP, ApiError, Cluster
from tests.cluster.forward import LoopbackForward
from tests.cluster.kubelet import NETNS_DIR, KubeletNode, tail
from tests.netns.conftest import sh

BUILD_IMAGE = REPO / "scripts" / "build-image.sh"
OVERLAY = REPO / "scripts" / "overlay-crds.py"
MANIFESTS = [
    REPO / "crds" / name
    for name in ("plexus-rbac.yaml", "plexus-config.yaml", "plexus-daemonset.yaml")
]
UNINSTALL = REPO / "crds" / "plexus-uninstall.yaml"
UNINSTALL_NAME = "plexus-uninstall"  # its DaemonSet
DAEMONSETS = "/apis/apps/v1/namespaces/kube-system/daemonsets"
IMAGE = "localhost/plexus:dev"
BUILD_TIMEOUT = 1800.0

Json = dict[str, Any]


def available() -> bool:
    """Whether this tree can build the image (else Plexus is started by hand)."""
    return BUILD_IMAGE.exists() and OVERLAY.exists()


def build_image(tag: str = IMAGE) -> Path:
    """The docker-archive of the image, built (or found in its cache) under `tag`."""
    done = subprocess.run(
        [str(BUILD_IMAGE), tag], capture_output=True, text=True, timeout=BUILD_TIMEOUT
    )
    if done.returncode != 0:
        raise RuntimeError(f"{BUILD_IMAGE.name} {tag} failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def manifests(
    image: str, files: list[Path] = MANIFESTS, host_paths: dict[str, str] | None = None
) -> list[Json]:
    """crds/ through the documented overlay (scripts/overlay-crds.py): the image, and the
    `host_paths` moved (OLD -> NEW). One copy for all nodes: each node's mount namespace
    gives the same hostPaths its own dirs, so the per-node copies the overlay offers are
    not needed."""
    moves = [f"--host-path={old}={new}" for old, new in (host_paths or {}).items()]
    done = subprocess.run(
        [sys.executable, str(OVERLAY), "--image", image, *moves, *map(str, files)],
        capture_output=True,
        text=True,
        check=True,
    )
    return [obj for obj in yaml.safe_load_all(done.stdout) if obj]


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
    for obj in manifests(image):
        cluster.apply(obj)


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
    """As the README says: `kubectl delete -f` the manifests (the DaemonSet first, its
    pods gone), then crds/plexus-uninstall.yaml applied until ready on every node and
    deleted."""
    delete_daemonset(cluster)
    for obj in reversed(manifests(image)):
        delete(cluster, cluster.object_path(obj))
    (daemonset,) = manifests(image, [UNINSTALL])
    cluster.apply(daemonset)
    wait_daemonset(cluster, nodes, image, UNINSTALL_NAME)
    delete_daemonset(cluster, UNINSTALL_NAME)


def set_image(cluster: Cluster, image: str) -> None:
    """The upgrade: the DaemonSet applied again through the overlay with another image."""
    (daemonset,) = [obj for obj in manifests(image) if obj["kind"] == "DaemonSet"]
    cluster.apply(daemonset)


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

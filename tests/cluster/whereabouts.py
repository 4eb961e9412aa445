"""whereabouts on the test control plane: its CRDs, its pools, its real binary.

`install_crds()` applies crds/whereabouts-crds.yaml and waits until the resources take
writes. `WhereaboutsBinary` runs the whereabouts CNI binary (scripts/build-go-tools.sh)
against the cluster as the admin, with a kubeconfig whose context names the pools'
namespace and a flat file, as whereabouts' installer sets it up. `ipam_args()` builds the
CNI call both it and Plexus's in-process IPAM take.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from cni.env import CmdArgs, cni_env
from cni.errors import CNIError
from tests.cluster.apiserver import REPO, TOOLS, ApiError, Cluster

CRDS = REPO / "crds" / "whereabouts-crds.yaml"
IPAMCLAIMS_CRD = REPO / "crds" / "ipamclaims-crd.yaml"
IPAM_RBAC = REPO / "crds" / "plexus-ipam-rbac.yaml"
API = "/apis/whereabouts.cni.cncf.io/v1alpha1"
BINARY = TOOLS / "whereabouts"
CRD_TIMEOUT = 60.0

Json = dict[str, Any]


def install_crds(cluster: Cluster, path: Path = CRDS) -> None:
    """Apply whereabouts' CRDs (those of `path`) and wait until each takes writes."""
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for doc in docs:
        cluster.apply(doc)
    deadline = time.monotonic() + CRD_TIMEOUT
    for doc in docs:
        name = doc["metadata"]["name"]
        while not _established(cluster, name):
            assert time.monotonic() < deadline, f"CRD {name} not established"
            time.sleep(0.1)
        plural = doc["spec"]["names"]["plural"]
        group_version = f"{doc['spec']['group']}/{doc['spec']['versions'][0]['name']}"
        while True:
            try:
                cluster.get(f"/apis/{group_version}/{plural}")
                break
            except ApiError as err:
                assert time.monotonic() < deadline, f"{plural} not served: {err}"
                time.sleep(0.1)


def install_ipam_rbac(cluster: Cluster) -> None:
    """The daemon service account's rights to the pools (crds/plexus-ipam-rbac.yaml)."""
    for doc in yaml.safe_load_all(IPAM_RBAC.read_text()):
        if doc:
            cluster.apply(doc)


def install_ipamclaims_crd(cluster: Cluster) -> None:
    """The IPAMClaim CRD (crds/ipamclaims-crd.yaml), served."""
    install_crds(cluster, IPAMCLAIMS_CRD)


def _established(cluster: Cluster, name: str) -> bool:
    """Established for 2 s: the CR handler delays creates that come sooner by 2 s."""
    crd = cluster.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    for cond in (crd.get("status") or {}).get("conditions") or []:
        if cond["type"] == "Established" and cond["status"] == "True":
            since = datetime.fromisoformat(cond["lastTransitionTime"].replace("Z", "+00:00"))
            return time.time() - since.timestamp() > 2.05
    return False


def pool(cluster: Cluster, namespace: str, name: str) -> Json | None:
    """The IPPool, or None."""
    try:
        found: Json = cluster.get(f"{API}/namespaces/{namespace}/ippools/{name}")
    except ApiError as err:
        if err.status == 404:
            return None
        raise
    return found


def allocations(cluster: Cluster, namespace: str, name: str) -> dict[str, Json]:
    """The pool's allocations by offset ({} without the pool)."""
    found = pool(cluster, namespace, name)
    return dict((found or {}).get("spec", {}).get("allocations") or {})


def reservations(cluster: Cluster, namespace: str) -> dict[str, Json]:
    """The namespace's OverlappingRangeIPReservations by name."""
    items = cluster.get(f"{API}/namespaces/{namespace}/overlappingrangeipreservations")["items"]
    return {r["metadata"]["name"]: r for r in items}


def ipam_conf(ipam: Json, name: str = "wbnet", version: str = "1.0.0") -> Json:
    """A macvlan network config with `ipam` (the whole config is what an IPAM reads)."""
    return {"cniVersion": version, "name": name, "type": "macvlan", "ipam": ipam}


def ipam_args(
    command: str,
    conf: Json,
    container_id: str,
    pod: str = "",
    namespace: str = "pods",
    ifname: str = "net1",
) -> CmdArgs:
    """A CNI call of an IPAM, from pod `namespace/pod`, as a runtime makes it."""
    pairs = [("IgnoreUnknown", "1"), ("K8S_POD_NAMESPACE", namespace)]
    pairs.append(("K8S_POD_NAME", pod or f"pod-{container_id}"))
    return CmdArgs(
        command,
        container_id,
        "/var/run/netns/none",
        ifname,
        tuple(pairs),
        ("/opt/cni/bin",),
        json.dumps(conf).encode(),
    )


class WhereaboutsBinary:
    """whereabouts' CNI binary, storing its pools in `namespace` as the cluster's admin."""

    def __init__(self, cluster: Cluster, namespace: str, workdir: Path) -> None:
        self.namespace = namespace
        workdir.mkdir(parents=True, exist_ok=True)
        config = yaml.safe_load(cluster.kubeconfig.read_text())
        for context in config["contexts"]:
            context["context"]["namespace"] = namespace
        self.kubeconfig = workdir / "whereabouts.kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump(config))
        self.flat_file = workdir / "whereabouts.conf"
        self.flat_file.write_text(
            json.dumps(
                {"datastore": "kubernetes", "kubernetes": {"kubeconfig": str(self.kubeconfig)}}
            )
        )

    def conf(self, conf: Json) -> Json:
        """`conf` with the flat file named, so the binary finds its kubeconfig."""
        ipam = {**conf["ipam"], "configuration_path": str(self.flat_file)}
        return {**conf, "ipam": ipam}

    def run(self, args: CmdArgs, node: str = "") -> Json:
        """One call (as node `node`: its NODENAME); the ADD result ({} for other verbs);
        CNIError if it failed."""
        env: Mapping[str, str] = {
            **cni_env(
                args.command, args.container_id, args.netns, args.ifname, args.args, args.path
            ),
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            **({"NODENAME": node} if node else {}),
        }
        stdin = json.dumps(self.conf(json.loads(args.stdin))).encode()
        done = subprocess.run(
            [str(BINARY)], input=stdin, env=dict(env), capture_output=True, timeout=120
        )
        out = done.stdout.decode()
        if done.returncode != 0:
            error: Json = json.loads(out) if out.strip() else {}
            raise CNIError(int(error.get("code", 999)), str(error.get("msg", done.stderr)))
        return json.loads(out) if out.strip() else {}


def binary_missing() -> str:
    """Why the whereabouts binary cannot run here ("" if it can)."""
    return "" if os.access(BINARY, os.X_OK) else f"{BINARY} not built (run make setup)"

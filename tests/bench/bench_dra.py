"""DRA kubelet plugin: NodePrepareResources / NodeUnprepareResources of one VF.

The kubelet's calls over the plugin's unix socket (DRAPlugin v1), against a real
kube-apiserver, on a FAKE sysfs (the host has no SR-IOV). Each run does what the scheduler
and the kubelet do before a Prepare, untimed: a new pod, the claim allocated and reserved
for it, the pod bound to the node (which the plugin's pod watch sees and prefetches the
claim on), then the kubelet's own GET of the claim; then the timed NodePrepareResources:
taking the prefetched claim (waiting for it if the prefetch is not done yet), the plan,
the state file and the CDI spec (both fsynced); no driver rebind (the claim asks for none,
which is what the bar excludes). Unprepare removes both files. "again" is a repeated
Prepare of a claim already prepared (answered from the state on disk, as after a plugin
restart).

    sudo .venv/bin/python3 -m tests.bench.bench_dra --runs 50
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import grpc

from deviceplugin.dra.claims import ClaimCache
from deviceplugin.dra.prepare import PoolDevice, Preparer
from deviceplugin.dra.server import DraServer
from deviceplugin.dra.slices import DRIVER, device_name, pool_name
from deviceplugin.dra.state import PreparedState
from deviceplugin.kubelet import dra_v1_pb2 as pb
from deviceplugin.kubelet import dra_v1_pb2_grpc as pb_grpc
from deviceplugin.sysfs import discover
from kube.api import KubeAPI
from tests.cluster.apiserver import Cluster
from tests.unit.deviceplugin.fake_sysfs import FakeSysfs

NODE = "bench-node"
RESOURCE = "intel.com/bench_vf"
VF = "0000:3b:02.0"
Json = dict[str, Any]


def _claim(cluster: Cluster, namespace: str) -> Json:
    """A claim for the VF, not yet allocated."""
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    spec = {"devices": {"requests": [{"name": "vf", "exactly": {"deviceClassName": DRIVER}}]}}
    return cluster.create(path, {"metadata": {"name": "bench"}, "spec": spec})


def _schedule(cluster: Cluster, namespace: str, claim: Json, pod_name: str) -> None:
    """The scheduler's part: a pod using the claim, the claim allocated and reserved for
    it, the pod bound to the node."""
    pods = f"/api/v1/namespaces/{namespace}/pods"
    pod = cluster.create(
        pods,
        {
            "metadata": {"name": pod_name},
            "spec": {
                "containers": [
                    {"name": "c", "image": "bench", "resources": {"claims": [{"name": "vf"}]}}
                ],
                "resourceClaims": [{"name": "vf", "resourceClaimName": "bench"}],
            },
        },
    )
    result = {
        "request": "vf",
        "driver": DRIVER,
        "pool": pool_name(NODE, RESOURCE),
        "device": device_name(VF),
    }
    claim["status"] = {
        "allocation": {"devices": {"results": [result]}},
        "reservedFor": [{"resource": "pods", "name": pod_name, "uid": pod["metadata"]["uid"]}],
    }
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/bench"
    claim.update(cluster.request("PUT", f"{path}/status", claim))
    binding = {"metadata": {"name": pod_name}, "target": {"kind": "Node", "name": NODE}}
    cluster.create(f"{pods}/{pod_name}/binding", {"apiVersion": "v1", "kind": "Binding", **binding})
    cluster.get(path)  # the kubelet's own read of the claim before it calls Prepare


def _stats(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "median_ms": round(statistics.median(ordered), 3),
        "p90_ms": round(ordered[int(len(ordered) * 0.9) - 1], 3),
        "min_ms": round(ordered[0], 3),
    }


def run(runs: int) -> dict[str, dict[str, float]]:
    with Cluster.running() as cluster, tempfile.TemporaryDirectory(prefix="pxdra-") as tmp:
        work = Path(tmp)
        namespace = f"bench-{uuid.uuid4().hex[:6]}"
        cluster.create_namespace(namespace)
        claim = _claim(cluster, namespace)
        uid = str(claim["metadata"]["uid"])
        sysfs = FakeSysfs(work / "sys")
        sysfs.add_pf("0000:3b:00.0", "ens1f0")
        sysfs.add_vf("0000:3b:00.0", 0, VF, netdev="ens1f0v0")
        (vf,) = [d for d in discover(sysfs.root) if d.is_vf]
        api = KubeAPI(str(cluster.kubeconfig))
        cache = ClaimCache(api, NODE)
        cache.start()
        preparer = Preparer(
            api, PreparedState(work / "state"), work / "cdi", sysfs.root, claims=cache
        )
        preparer.set_devices(
            {pool_name(NODE, RESOURCE): {device_name(VF): PoolDevice(RESOURCE, vf)}}
        )
        server = DraServer(preparer, work / "registry", work / "plugins")
        server.start()
        claims = [pb.Claim(namespace=namespace, uid=uid, name="bench")]
        prepare, again, unprepare = [], [], []
        try:
            with grpc.insecure_channel(f"unix://{server.service_socket}") as channel:
                stub = pb_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
                for i in range(runs + 3):  # the first three warm the connections up
                    _schedule(cluster, namespace, claim, f"bench-{i}")
                    began = time.perf_counter()
                    done = stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=claims))
                    took = (time.perf_counter() - began) * 1000
                    assert done.claims[uid].error == "", done.claims[uid].error
                    began = time.perf_counter()
                    stub.NodePrepareResources(pb.NodePrepareResourcesRequest(claims=claims))
                    took_again = (time.perf_counter() - began) * 1000
                    began = time.perf_counter()
                    stub.NodeUnprepareResources(pb.NodeUnprepareResourcesRequest(claims=claims))
                    took_un = (time.perf_counter() - began) * 1000
                    if i >= 3:
                        prepare.append(took)
                        again.append(took_again)
                        unprepare.append(took_un)
        finally:
            server.stop()
            cache.stop()
    return {
        "prepare_one_vf": _stats(prepare),
        "prepare_again_from_state": _stats(again),
        "unprepare_one_vf": _stats(unprepare),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    args = parser.parse_args()
    print(json.dumps({"runs": args.runs, **run(args.runs)}, indent=2))


if __name__ == "__main__":
    main()

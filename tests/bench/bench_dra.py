"""DRA kubelet plugin: NodePrepareResources / NodeUnprepareResources of one VF.

The kubelet's calls over the plugin's unix socket (DRAPlugin v1), against a real
kube-apiserver holding an allocated ResourceClaim, on a FAKE sysfs (the host has no
SR-IOV). Prepare is the whole path: the claim's GET, the plan, the state file and the
CDI spec (both fsynced); no driver rebind (the claim asks for none, which is what the
bar excludes). Unprepare removes both files. "again" is a repeated Prepare of a claim
already prepared (answered from the state on disk, as after a plugin restart).

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

import grpc

from deviceplugin.dra.prepare import PoolDevice, Preparer
from deviceplugin.dra.server import DraServer
from deviceplugin.dra.slices import DRIVER, device_name, pool_name
from deviceplugin.dra.state import PreparedState
from deviceplugin.kubelet import dra_v1_pb2 as pb
from deviceplugin.kubelet import dra_v1_pb2_grpc as pb_grpc
from deviceplugin.sysfs import discover
from meta.sources.kubeapi import KubeAPI
from tests.cluster.apiserver import Cluster
from tests.unit.deviceplugin.fake_sysfs import FakeSysfs

NODE = "bench-node"
RESOURCE = "intel.com/bench_vf"
VF = "0000:3b:02.0"


def _claim(cluster: Cluster, namespace: str) -> tuple[str, str]:
    """An allocated, reserved claim for the VF; (name, uid)."""
    path = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    spec = {"devices": {"requests": [{"name": "vf", "exactly": {"deviceClassName": DRIVER}}]}}
    claim = cluster.create(path, {"metadata": {"name": "bench"}, "spec": spec})
    claim["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {
                        "request": "vf",
                        "driver": DRIVER,
                        "pool": pool_name(NODE, RESOURCE),
                        "device": device_name(VF),
                    }
                ]
            }
        },
        "reservedFor": [{"resource": "pods", "name": "bench", "uid": str(uuid.uuid4())}],
    }
    cluster.request("PUT", f"{path}/bench/status", claim)
    return "bench", str(claim["metadata"]["uid"])


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
        name, uid = _claim(cluster, namespace)
        sysfs = FakeSysfs(work / "sys")
        sysfs.add_pf("0000:3b:00.0", "ens1f0")
        sysfs.add_vf("0000:3b:00.0", 0, VF, netdev="ens1f0v0")
        (vf,) = [d for d in discover(sysfs.root) if d.is_vf]
        preparer = Preparer(
            KubeAPI(str(cluster.kubeconfig)),
            PreparedState(work / "state"),
            work / "cdi",
            sysfs.root,
        )
        preparer.set_devices(
            {pool_name(NODE, RESOURCE): {device_name(VF): PoolDevice(RESOURCE, vf)}}
        )
        server = DraServer(preparer, work / "registry", work / "plugins")
        server.start()
        claims = [pb.Claim(namespace=namespace, uid=uid, name=name)]
        prepare, again, unprepare = [], [], []
        try:
            with grpc.insecure_channel(f"unix://{server.service_socket}") as channel:
                stub = pb_grpc.DRAPluginStub(channel)  # type: ignore[no-untyped-call]
                for i in range(runs + 3):  # the first three warm the connections up
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

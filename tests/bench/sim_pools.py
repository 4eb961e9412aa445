"""Pool size against write size and ADD latency, on a real kube-apiserver (and etcd).

One pool for a whole network (whereabouts' default shape): the pool is filled to each
size in turn (bulk patches of made-up allocations, as many pods would leave them), and at
each size the in-process IPAM's ADD + DEL is timed. Each ADD's request is one small JSON
patch, but the API server rewrites the whole object into etcd and sends it to every
watcher: the object's size is the write that grows. Past etcd's request limit (~1.5 MiB)
the pool takes no more allocations.

Node slices (`node_slice_size`): NODES simulated nodes, each with its slice of a /15 and
its own pool filled to PER_NODE allocations (tens of thousands in all); ADDs timed on a
sample of nodes. Each node's pool stays small whatever the network's size.

    sudo .venv/bin/python3 -m tests.bench.sim_pools --nodes 400 --per-node 100
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from cni.errors import CNIError
from cni.skel import dispatch
from delegates.ipam.whereabouts.plugin import ClusterIPAM
from kube.api import KubeAPI
from tests.cluster.apiserver import Cluster
from tests.cluster.whereabouts import API, install_crds, ipam_args, ipam_conf

NAMESPACE = "sim"
SIZES = (0, 1000, 2000, 4000, 6000, 8000, 10000, 12000, 14000)
FILL_BATCH = 500
TIMED = 20  # ADD + DEL cycles timed per point


def fake_entry(i: int) -> dict[str, str]:
    """An allocation as a pod leaves it: a 64-hex sandbox ID, a pod name, an interface."""
    return {"id": f"{i:064x}", "podref": f"tenant-{i % 50}/app-{i:08d}", "ifname": "net1"}


def fill(cluster: Cluster, pool: str, start: int, stop: int) -> None:
    """Put made-up allocations at offsets [start, stop) of `pool` (well past the timed
    ADDs' low offsets, so both never meet)."""
    path = f"{API}/namespaces/{NAMESPACE}/ippools/{pool}"
    for first in range(start, stop, FILL_BATCH):
        ops = [
            {"op": "add", "path": f"/spec/allocations/{1000 + i}", "value": fake_entry(i)}
            for i in range(first, min(stop, first + FILL_BATCH))
        ]
        cluster.request("PATCH", path, ops, content_type="application/json-patch+json")


def object_size(cluster: Cluster, pool: str) -> int:
    """The pool's size as the API server stores and sends it (JSON, managedFields too)."""
    obj = cluster.get(f"{API}/namespaces/{NAMESPACE}/ippools/{pool}")
    return len(json.dumps(obj, separators=(",", ":")))


def time_adds(ipam: ClusterIPAM, conf: dict[str, Any], tag: str, runs: int) -> float:
    """Median ms of an in-process ADD (then an untimed DEL)."""
    took = []
    for i in range(runs):
        args = ipam_args("ADD", conf, f"{tag}-{i}", namespace=NAMESPACE)
        start = time.perf_counter()
        dispatch(ipam, args)
        took.append((time.perf_counter() - start) * 1000)
        dispatch(ipam, ipam_args("DEL", conf, f"{tag}-{i}", namespace=NAMESPACE))
    return statistics.median(took)


def patch_size(conf: dict[str, Any]) -> int:
    """Bytes of the JSON patch one ADD sends (its test and its add)."""
    entry = {"id": "f" * 64, "podref": f"{NAMESPACE}/app-00000001", "ifname": "net1"}
    ops = [
        {"op": "test", "path": "/spec/allocations/4242", "value": None},
        {"op": "add", "path": "/spec/allocations/4242", "value": entry},
    ]
    return len(json.dumps(ops))


def one_pool(cluster: Cluster, api: KubeAPI) -> list[dict[str, Any]]:
    conf = ipam_conf(
        {"type": "whereabouts", "range": "10.128.0.0/16", "enable_overlapping_ranges": False},
        name="one",
    )
    ipam = ClusterIPAM(api, "sim-node", NAMESPACE, watch=False)
    time_adds(ipam, conf, "warm", 2)  # creates the pool
    rows, filled = [], 0
    for size in SIZES:
        try:
            fill(cluster, "10.128.0.0-16", filled, size)
        except Exception as exc:
            rows.append({"allocations": size, "error": str(exc)[:160]})
            break
        filled = size
        row: dict[str, Any] = {
            "allocations": size,
            "object bytes": object_size(cluster, "10.128.0.0-16"),
            "patch bytes": patch_size(conf),
        }
        try:
            row["ADD ms"] = time_adds(ipam, conf, f"s{size}", TIMED)
        except CNIError as exc:
            row["error"] = exc.msg[:160]
        rows.append(row)
    return rows


def slices(cluster: Cluster, api: KubeAPI, nodes: int, per_node: int) -> dict[str, Any]:
    conf = ipam_conf(
        {
            "type": "whereabouts",
            "range": "10.0.0.0/15",
            "node_slice_size": "/25",
            "network_name": "big",
            "enable_overlapping_ranges": False,
        },
        name="big",
    )
    names = [f"sim-node-{n:04d}" for n in range(nodes)]
    ipams = {n: ClusterIPAM(api, n, NAMESPACE, watch=False) for n in names}
    start = time.perf_counter()

    def take(node: str) -> str:
        cfg = ipams[node].config(ipam_args("ADD", conf, "x", namespace=NAMESPACE))
        ((rng, pool),) = ipams[node].allocator.ranges_of(cfg)
        body = {
            "apiVersion": "whereabouts.cni.cncf.io/v1alpha1",
            "kind": "IPPool",
            "metadata": {"name": pool},
            "spec": {
                "range": rng.cidr,
                "allocations": {str(10 + i): fake_entry(i) for i in range(per_node)},
            },
        }
        cluster.create(f"{API}/namespaces/{NAMESPACE}/ippools", body)
        return pool

    with ThreadPoolExecutor(8) as pool:
        pools = dict(zip(names, pool.map(take, names), strict=True))
    setup = time.perf_counter() - start
    sample = names[:: max(1, nodes // 10)]
    took = [time_adds(ipams[n], conf, f"t{i}", TIMED // 4) for i, n in enumerate(sample)]
    slice_pool = cluster.get(f"{API}/namespaces/{NAMESPACE}/nodeslicepools/big")
    return {
        "nodes": nodes,
        "allocations": nodes * per_node,
        "per-node pool bytes": object_size(cluster, pools[names[0]]),
        "NodeSlicePool bytes": len(json.dumps(slice_pool, separators=(",", ":"))),
        "patch bytes": patch_size(conf),
        "ADD ms": statistics.median(took),
        "setup s": setup,
    }


def render(single: list[dict[str, Any]], sliced: dict[str, Any]) -> str:
    lines = [
        "| allocations in the one pool | stored object (KiB) | ADD's patch (B) | ADD (ms) |",
        "|---|---|---|---|",
    ]
    for row in single:
        if "object bytes" not in row:
            lines.append(f"| {row['allocations']} | refused: {row['error']} | | |")
            continue
        add = f"{row['ADD ms']:.1f}" if "ADD ms" in row else f"failed: {row['error']}"
        lines.append(
            f"| {row['allocations']} | {row['object bytes'] / 1024:.0f} | "
            f"{row['patch bytes']} | {add} |"
        )
    s = sliced
    lines += [
        "",
        f"node slices: {s['nodes']} nodes x {s['allocations'] // s['nodes']} allocations = "
        f"{s['allocations']} allocations; a node's pool {s['per-node pool bytes'] / 1024:.0f} "
        f"KiB, the NodeSlicePool {s['NodeSlicePool bytes'] / 1024:.0f} KiB, an ADD's patch "
        f"{s['patch bytes']} B, ADD {s['ADD ms']:.1f} ms (median over a sample of nodes); "
        f"setup {s['setup s']:.0f} s",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=400)
    parser.add_argument("--per-node", type=int, default=100)
    args = parser.parse_args()
    with Cluster.running() as cluster:
        install_crds(cluster)
        cluster.create_namespace(NAMESPACE)
        api = KubeAPI(str(cluster.kubeconfig))
        single = one_pool(cluster, api)
        sliced = slices(cluster, api, args.nodes, args.per_node)
    print(render(single, sliced))


if __name__ == "__main__":
    main()

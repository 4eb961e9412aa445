"""whereabouts exec'd vs served in process by the Plexus daemon, on a real kube-apiserver.

Three Plexus daemons per node, the same but for one key: `execDelegates: ["whereabouts"]`
(the whereabouts v0.9.4 binary, scripts/build-go-tools.sh, is exec'd as the macvlan's
IPAM), none (allocated in process), `ipamReserve: 4` (in process, from addresses the node
reserved ahead). Each pod ADD attaches the reference `bridge` (host-local) as the default
network and one macvlan NAD whose IPAM is whereabouts (one pool, 10.60.0.0/16, shared by
all). Rounds interleave the contenders; each ADD is exec'd through the shim as a runtime
does, and followed by an untimed DEL. The bar is the macvlan step: its `delegate add` time
in the daemon's own log (IPAM included), medians; the whole ADD is timed from outside too
(`ip netns exec` baseline subtracted).

Then a burst per contender: its daemons on two nodes (two node names on this one
machine), BURST pods split between them, all ADDs at once; the time until the last one
returned, failures, whether any address was handed out twice, and the IPAM's API requests
(and conflicts) per pod from the API server's audit log.

    sudo .venv/bin/python3 -m tests.bench.bench_whereabouts --runs 30 --burst 100
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from ipaddress import ip_address
from pathlib import Path
from typing import Any

from tests.bench.bench_thick import Daemon, run_all
from tests.bench.common import GO_TOOLS, Bench, baseline, in_bench, one_add, sh
from tests.cluster.apiserver import Cluster, audit_events
from tests.cluster.whereabouts import API, WhereaboutsBinary, install_crds

NAMESPACE = "bench"
POOLS = "bench-ipam"
NAD = "wb"
RANGE = "10.60.0.0/16"
CONTENDERS: dict[str, dict[str, Any]] = {
    "whereabouts exec'd": {"execDelegates": ["whereabouts"]},
    "plexus in process": {},
    "plexus, reserving ahead": {"ipamReserve": 4},
}
"""Each contender's daemon config, beyond what they share."""
NODES = ("a", "b")
"""Per contender: its two daemons' nodes (named after it: two daemons of one node would
judge each other's allocations)."""
QUIET = 0.3  # after each ADD + DEL: the daemon's Events go out before the next timed ADD
SETTLE = 2.0
IPAM_RESOURCES = ("ippools", "overlappingrangeipreservations", "leases")
"""What the audit log's IPAM requests are about (whereabouts' Lease included)."""


def node_name(contender: str, node: str) -> str:
    """The node a contender's daemon serves: `plexus-reserving-b`, say."""
    words = contender.replace(",", "").replace("'", "").split()
    return f"{words[0]}-{words[-1]}-{node}"


class Setup:
    """The cluster, the NAD and a daemon per (contender, node)."""

    def __init__(self, bench: Bench, cluster: Cluster, stack: ExitStack) -> None:
        self.bench, self.cluster = bench, cluster
        install_crds(cluster)
        cluster.create_namespace(NAMESPACE)
        cluster.create_namespace(POOLS)
        binary = WhereaboutsBinary(cluster, POOLS, bench.root / "whereabouts")
        ipam = binary.conf({"ipam": {"type": "whereabouts", "range": RANGE}})["ipam"]
        ipam["kubernetes"] = {"kubeconfig": str(binary.kubeconfig)}
        macvlan = {**bench.macvlan(0), "name": NAD, "ipam": ipam}
        cluster.create(
            f"/apis/k8s.cni.cncf.io/v1/namespaces/{NAMESPACE}/network-attachment-definitions",
            {
                "apiVersion": "k8s.cni.cncf.io/v1",
                "kind": "NetworkAttachmentDefinition",
                "metadata": {"name": NAD},
                "spec": {"config": json.dumps(macvlan)},
            },
        )
        (bench.bin / "whereabouts").symlink_to(GO_TOOLS / "whereabouts")
        self.logs: dict[tuple[str, str], Path] = {}
        self.daemons = {
            (name, node): stack.enter_context(self.daemon(name, node, extra))
            for name, extra in CONTENDERS.items()
            for node in NODES
        }
        self.pods = 0

    @contextmanager
    def daemon(self, name: str, node: str, extra: dict[str, Any]) -> Iterator[Daemon]:
        tag = node_name(name, node)
        root = self.bench.root / tag
        net_dir = root / "net.d"
        net_dir.mkdir(parents=True)
        (net_dir / "10-bench.conf").write_text(json.dumps(self.bench.bridge()))
        config = root / "daemon.json"
        config.write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "plexus",
                    "type": "plexus",
                    "kubeconfig": str(self.cluster.kubeconfig),
                    "cniConfigDir": str(net_dir),
                    "binDir": str(self.bench.bin),
                    "cniDir": str(root / "cache"),
                    "socketDir": str(root / "run"),
                    "metricsPort": 0,
                    "logToStderr": False,
                    "logFile": str(root / "daemon.log"),
                    **extra,
                    "whereaboutsNamespace": POOLS,
                    "allowedHostPaths": [str(self.bench.root)],
                }
            )
        )
        plexus = Path(sys.executable).parent / "plexus"
        daemon = Daemon(
            tag,
            [str(plexus), "daemon", "--config", str(config), "--node-name", tag],
            {},
            net_dir / "00-plexus.conflist",
            root / "stderr.log",
        )
        self.logs[(name, node)] = root / "daemon.log"
        try:
            yield daemon
        finally:
            daemon.stop()

    def pod(self, contender: str, node: str) -> str:
        """A pod on `contender`'s node `node` asking for the NAD; its CNI_ARGS."""
        self.pods += 1
        name = f"pod-{self.pods}"
        created = self.cluster.create(
            f"/api/v1/namespaces/{NAMESPACE}/pods",
            {
                "metadata": {"name": name, "annotations": {"k8s.v1.cni.cncf.io/networks": NAD}},
                "spec": {
                    "nodeName": node_name(contender, node),
                    "containers": [{"name": "app", "image": "pause"}],
                },
            },
        )
        uid = created["metadata"]["uid"]
        return (
            f"IgnoreUnknown=1;K8S_POD_NAMESPACE={NAMESPACE};K8S_POD_NAME={name};K8S_POD_UID={uid}"
        )

    def shim(self, name: str, node: str) -> tuple[str, dict[str, Any]]:
        return str(self.bench.bin / "plexus"), self.daemons[(name, node)].conf

    def used(self) -> list[str]:
        """The pool's addresses now."""
        pools = self.cluster.get(f"{API}/namespaces/{POOLS}/ippools")["items"]
        base = ip_address(RANGE.split("/")[0])
        return [str(base + int(k)) for p in pools for k in (p["spec"].get("allocations") or {})]


def macvlan_steps(log: Path) -> list[float]:
    """The macvlan's `delegate add` ms of each ADD in a daemon's log, in order."""
    steps = []
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        if entry.get("msg") == "delegate add" and entry.get("network") == f"{NAMESPACE}/{NAD}":
            steps.append(float(entry["ms"]))
    return steps


def sequential(setup: Setup, runs: int) -> dict[str, dict[str, float]]:
    """Interleaved ADDs on node a: medians of the whole ADD and of the macvlan step."""
    node = NODES[0]
    args = {name: setup.pod(name, node) for name in CONTENDERS}
    time.sleep(SETTLE)
    whole: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    base = []
    for name in CONTENDERS:  # warm-up, not counted
        one_add(setup.bench, *setup.shim(name, node), args[name])
    for _ in range(runs):
        base.append(baseline(setup.bench))
        for name in CONTENDERS:
            whole[name].append(one_add(setup.bench, *setup.shim(name, node), args[name]))
            time.sleep(QUIET)
    time.sleep(SETTLE)  # the daemons' log lines are written by a thread of their own
    offset = statistics.median(base)
    out = {}
    for name in CONTENDERS:
        mine = macvlan_steps(setup.logs[(name, node)])[1:]  # the warm-up's first
        out[name] = {
            "whole ADD (ms)": statistics.median(whole[name]) - offset,
            "macvlan step (ms)": statistics.median(mine),
            "steps found": float(len(mine)),
        }
    return out


def burst(setup: Setup, name: str, pods: int) -> dict[str, float]:
    """`pods` ADDs at once across both nodes: seconds until the last returned, failures,
    addresses handed out twice; then all DELs."""
    calls: dict[str, list[tuple[str, str, str]]] = {node: [] for node in NODES}
    for i in range(pods):
        node = NODES[i % len(NODES)]
        cid = f"burst-{setup.bench.tag}-{node_name(name, node)}-{i}"
        calls[node].append((cid, f"/run/netns/{setup.bench.pod()}", setup.pod(name, node)))
    time.sleep(SETTLE)
    failed = [0]
    audited = len(audit_events(setup.cluster.audit_log, ""))
    start = time.perf_counter()

    def run(node: str) -> None:
        failed[0] += run_all(setup.bench, "ADD", *setup.shim(name, node), calls[node])

    threads = [threading.Thread(target=run, args=(node,)) for node in NODES]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - start
    time.sleep(SETTLE)  # the audit log is written once a request is answered
    requests = [
        e
        for e in audit_events(setup.cluster.audit_log, "")[audited:]
        if e.get("objectRef", {}).get("resource") in IPAM_RESOURCES
    ]
    used = setup.used()
    for node in NODES:
        run_all(setup.bench, "DEL", *setup.shim(name, node), calls[node])
        for _, netns, _ in calls[node]:
            sh("ip", "netns", "del", netns.rsplit("/", 1)[1])
    return {
        "seconds": took,
        "failed": float(failed[0]),
        "twice": float(len(used) - len(set(used))),
        "IPAM requests per pod": len(requests) / pods,
        "conflicts per pod": sum(
            e.get("responseStatus", {}).get("code") in (409, 422) for e in requests
        )
        / pods,
    }


def measure(bench: Bench, runs: int, pods: int) -> dict[str, Any]:
    with ExitStack() as stack:
        cluster = stack.enter_context(Cluster.running())
        setup = Setup(bench, cluster, stack)
        rows = sequential(setup, runs)
        bursts = {name: burst(setup, name, pods) for name in CONTENDERS}
    return {"rows": rows, "bursts": bursts, "runs": runs, "pods": pods}


def render(result: dict[str, Any]) -> str:
    rows, bursts = result["rows"], result["bursts"]
    anchor = "whereabouts exec'd"
    lines = [
        "| IPAM of the macvlan | macvlan step (ms) | whole ADD (ms) | "
        f"burst of {result['pods']} pods on 2 nodes (s) | failed | handed out twice "
        "| IPAM requests per pod | of them conflicts (409/422) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in rows.items():
        b = bursts[name]
        lines.append(
            f"| {name} | {row['macvlan step (ms)']:.1f} | {row['whole ADD (ms)']:.1f} | "
            f"{b['seconds']:.2f} | {b['failed']:g} | {b['twice']:g} | "
            f"{b['IPAM requests per pod']:.1f} | {b['conflicts per pod']:.2f} |"
        )
    lines.append("")
    for name in rows:
        if name == anchor:
            continue
        step = rows[name]["macvlan step (ms)"] / rows[anchor]["macvlan step (ms)"]
        whole = rows[name]["whole ADD (ms)"] / rows[anchor]["whole ADD (ms)"]
        spread = bursts[name]["seconds"] / bursts[anchor]["seconds"]
        lines.append(
            f"{name} / exec'd: macvlan step {step:.2f}x (bar 0.2x), whole ADD {whole:.2f}x, "
            f"burst {spread:.2f}x"
        )
    found = ", ".join(f"{row['steps found']:g}" for row in rows.values())
    lines.append(
        f"medians of {result['runs']} interleaved rounds (steps found in the logs: {found})"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--burst", type=int, default=100)
    args = parser.parse_args()
    tools = ("etcd", "kube-apiserver", "whereabouts")
    print(render(in_bench("bench_whereabouts", tools, lambda b: measure(b, args.runs, args.burst))))


if __name__ == "__main__":
    main()

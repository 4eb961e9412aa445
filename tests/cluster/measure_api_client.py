"""The kubernetes package's ApiClient and urllib3 against Plexus's own client
(docs/architecture.md).

    .venv/bin/python -m tests.cluster.measure_api_client [rounds]

Starts a throwaway etcd + kube-apiserver (tests/cluster/apiserver.py), then prints medians:
the import cost and RSS of each client in a fresh interpreter, and, interleaved in one
process, the calls the daemon makes: a merge PATCH of pods/status, an Event POST, and a
list of 100 pods (what an informer's re-list costs, objects decoded). "urllib3" is the
same request through a urllib3 PoolManager, as kube/api.py made it before;
"as the daemon sends it" is the strategic merge patch with unknown fields ignored that
meta/sources/kube.py sends (the others send a JSON merge patch), last timed again after
the API server has been idle for a while.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import urllib3

from kube.api import KubeAPI
from tests.cluster.apiserver import Cluster

IMPORTS = {
    "nothing (interpreter start)": "pass",
    "http.client and ssl (ours)": "import http.client, ssl",
    "urllib3": "import urllib3",
    "kubernetes (config loader and ApiClient)": "import kubernetes.client, kubernetes.config",
}
_RSS = "import resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)"


def _import_cost(statement: str, rounds: int) -> tuple[float, float]:
    """(median ms, median max RSS MiB) of a fresh `python -c statement`."""
    times, rss = [], []
    for _ in range(rounds):
        started = time.perf_counter()
        out = subprocess.run(
            [sys.executable, "-c", f"{statement}; {_RSS}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        times.append((time.perf_counter() - started) * 1000)
        rss.append(int(out) / 1024)
    return statistics.median(times), statistics.median(rss)


def _pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"k8s.v1.cni.cncf.io/networks": "a,b"}},
        "spec": {"nodeName": "n", "containers": [{"name": "app", "image": "pause"}]},
    }


def _event(namespace: str, i: int) -> dict[str, Any]:
    return {
        "metadata": {"generateName": "p0.", "namespace": namespace},
        "involvedObject": {"kind": "Pod", "namespace": namespace, "name": "p0"},
        "reason": "AddedInterface",
        "message": f"Add net1 [10.1.0.{i % 250}/24] from {namespace}/macvlan",
        "type": "Normal",
    }


def _calls(cluster: Cluster, rounds: int) -> dict[str, dict[str, float]]:
    from kubernetes import client, config

    namespace = f"pxm-{uuid.uuid4().hex[:6]}"
    cluster.create_namespace(namespace)
    for i in range(100):
        cluster.create(f"/api/v1/namespaces/{namespace}/pods", _pod(f"p{i}"))
    cfg = client.Configuration()
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(cluster.kubeconfig), client_configuration=cfg
    )
    theirs = client.CoreV1Api(client.ApiClient(cfg))
    ours = KubeAPI(str(cluster.kubeconfig))
    pool = urllib3.PoolManager(
        ca_certs=cfg.ssl_ca_cert, cert_file=cfg.cert_file, key_file=cfg.key_file
    )

    def pooled(method: str, path: str, body: dict[str, Any], content_type: str) -> object:
        data = json.dumps(body).encode()
        headers = {"Accept": "application/json", "Content-Type": content_type}
        response = pool.request(method, cfg.host + path, body=data, headers=headers)
        return json.loads(response.data)

    status = f"/api/v1/namespaces/{namespace}/pods/p0/status"

    def _model_event(i: int) -> client.CoreV1Event:
        raw = _event(namespace, i)
        return client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name="p0.", namespace=namespace),
            involved_object=client.V1ObjectReference(**raw["involvedObject"]),
            reason=raw["reason"],
            message=raw["message"],
            type=raw["type"],
        )

    def patch(value: str) -> dict[str, Any]:
        return {"metadata": {"annotations": {"k8s.v1.cni.cncf.io/network-status": value}}}

    contenders: dict[str, dict[str, Callable[[int], object]]] = {
        "PATCH pods/status": {
            "ApiClient": lambda i: theirs.patch_namespaced_pod_status(
                "p0", namespace, patch(str(i))
            ),
            "urllib3": lambda i: pooled(
                "PATCH", status, patch(str(i)), "application/merge-patch+json"
            ),
            "ours": lambda i: ours.request(
                "PATCH", status, patch(str(i)), content_type="application/merge-patch+json"
            ),
            "ours, as the daemon sends it": lambda i: ours.request(
                "PATCH",
                f"{status}?fieldValidation=Ignore",
                patch(str(i)),
                content_type="application/strategic-merge-patch+json",
            ),
        },
        "POST event": {
            "ApiClient": lambda i: theirs.create_namespaced_event(namespace, _model_event(i)),
            "ours": lambda i: ours.request(
                "POST", f"/api/v1/namespaces/{namespace}/events", _event(namespace, i)
            ),
        },
        "list 100 pods": {
            "ApiClient": lambda i: theirs.list_namespaced_pod(namespace),
            "ours": lambda i: ours.request("GET", f"/api/v1/namespaces/{namespace}/pods"),
        },
    }
    results: dict[str, dict[str, float]] = {}
    for call, clients in contenders.items():
        samples: dict[str, list[float]] = {name: [] for name in clients}
        for i in range(rounds):
            for name, run in clients.items():  # interleaved: load noise hits both alike
                started = time.perf_counter()
                run(i)
                samples[name].append((time.perf_counter() - started) * 1000)
        results[call] = {name: statistics.median(s) for name, s in samples.items()}
    # The bench's ADDs reach an API server idle since the last one; so does a quiet node's.
    send = contenders["PATCH pods/status"]["ours, as the daemon sends it"]
    pauses = {f"after {ms} ms idle": ms / 1000 for ms in (1, 5, 20, 100)}
    waited: dict[str, list[float]] = {name: [] for name in pauses}
    for i in range(rounds):
        for name, pause in pauses.items():
            time.sleep(pause)
            started = time.perf_counter()
            send(i)
            waited[name].append((time.perf_counter() - started) * 1000)
    results["PATCH pods/status as the daemon sends it"] = {
        name: statistics.median(s) for name, s in waited.items()
    }
    return results


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    for what, statement in IMPORTS.items():
        ms, rss = _import_cost(statement, max(5, rounds // 10))
        print(f"import {what}: {ms:.0f} ms, max RSS {rss:.1f} MiB")
    with Cluster.running() as cluster:
        for call, by_client in _calls(cluster, rounds).items():
            cells = ", ".join(f"{name} {ms:.2f} ms" for name, ms in by_client.items())
            print(f"{call} (median of {rounds}): {cells}")


if __name__ == "__main__":
    main()

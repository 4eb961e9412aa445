"""ADD latency on a real kube-apiserver: Plexus daemon vs Multus thick vs Multus thin vs raw.

A real etcd + kube-apiserver (tests/cluster/apiserver.py) serves the pods and the N
macvlan NADs their annotation names; the reference `bridge` is the default network
(the first conf in each daemon's net.d). Each contender is exec'd as a runtime does:
the shim with the CNI env and the conf its daemon generated (`00-multus.conf` for
multus-shim + multus-daemon, `00-plexus.conflist` for the compiled `plexus` shim +
`plexus daemon`), Multus thin with a kubeconfig, and the raw delegates one after the
other. Rounds interleave the contenders; each ADD is followed by an untimed DEL on a
fresh pod namespace. Then: both daemons' RSS (idle, after 20 ADDs, and the peak over 100
concurrent pod ADDs) and the API requests per ADD from the apiserver's audit log.

Multus v4.2 thick ignores a kubeconfig: its daemon gets a per-node client certificate
(O=system:multus, CN=system:multus:<node>) placed where its certificate store looks,
with a bootstrap kubeconfig carrying the CA inline. Plexus gets its own client cert;
both identities are bound to the same ClusterRole.

The whole run happens inside the bench's private node namespace (so the daemons reach
the apiserver on that namespace's loopback), and everything it creates is removed.

    sudo .venv/bin/python3 -m tests.bench.bench_thick --runs 30 --extras 1,2,4,8
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from tests.bench.common import GO_TOOLS, Bench, arguments, baseline, in_bench, one_add, raw_add, sh
from tests.cluster.apiserver import Cluster, audit_events

NODE = "bench-node"
NAMESPACE = "bench"
BURST = 100
WARM_ADDS = 20  # sequential ADDs (bridge + 1 macvlan) before the second RSS reading
AUDIT_ADDS = 5  # ADDs per contender and N whose API requests are counted
SETTLE = 2.0  # seconds for watches to deliver new pods, and for background requests
QUIET = 0.3
"""Seconds after each contender's ADD + DEL: both daemons send Events after answering,
and those requests must not land in the next contender's timed ADD."""
# Who sent an audited request, by User-Agent prefix (client-go uses the binary's name).
AGENTS = {"plexus daemon": "plexus/", "multus thick": "multus-daemon/", "multus thin": "multus/"}
VERBS = ("get", "list", "patch", "create", "update")
# What Multus thick's manifests grant it; Plexus gets the same.
RULES = [
    {"apiGroups": ["k8s.cni.cncf.io"], "resources": ["*"], "verbs": ["*"]},
    {
        "apiGroups": [""],
        "resources": ["pods", "pods/status"],
        "verbs": ["get", "list", "watch", "update", "patch"],
    },
    {
        "apiGroups": ["", "events.k8s.io"],
        "resources": ["events"],
        "verbs": ["create", "patch", "update"],
    },
]


def grant(cluster: Cluster, groups: list[str]) -> None:
    """The ClusterRole both CNI daemons need, bound to their groups."""
    rbac = "rbac.authorization.k8s.io/v1"
    cluster.apply(
        {
            "apiVersion": rbac,
            "kind": "ClusterRole",
            "metadata": {"name": "bench-cni"},
            "rules": RULES,
        }
    )
    cluster.apply(
        {
            "apiVersion": rbac,
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "bench-cni"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "bench-cni",
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": g}
                for g in groups
            ],
        }
    )


def generated(conf_file: Path) -> dict[str, Any]:
    """What a runtime sends the first plugin of a generated .conf or .conflist."""
    conf: dict[str, Any] = json.loads(conf_file.read_text())
    if "plugins" not in conf:
        return conf
    return {"cniVersion": conf["cniVersion"], "name": conf["name"], **conf["plugins"][0]}


def slug(contender: str) -> str:
    return contender.replace(" ", "-")


def rss(pid: int, field: str = "VmRSS") -> float:
    """A memory figure of /proc/<pid>/status, in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


class Daemon:
    """One CNI daemon process (started and stopped by PID) and the conf it generates."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], conf: Path, log: Path):
        self.name = name
        self.conf_file = conf
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                argv, env={**os.environ, **env}, stdin=subprocess.DEVNULL, stdout=out, stderr=out
            )
        deadline = time.monotonic() + 60
        while not conf.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{name} did not write {conf}: {log.read_text()[-2000:]}")
            time.sleep(0.05)
        self.conf = generated(conf)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Thick:
    """The cluster, the NADs and the three API-backed contenders around one node."""

    def __init__(self, bench: Bench, cluster: Cluster, stack: ExitStack) -> None:
        self.bench, self.cluster = bench, cluster
        root = bench.root
        cluster.create_namespace(NAMESPACE)
        grant(cluster, ["system:multus", "plexus:nodes"])
        for i in range(8):
            self.api(
                "POST",
                "network-attachment-definitions",
                {
                    "apiVersion": "k8s.cni.cncf.io/v1",
                    "kind": "NetworkAttachmentDefinition",
                    "metadata": {"name": f"mv{i}"},
                    "spec": {"config": json.dumps(bench.macvlan(i))},
                },
            )
        multus_pem = cluster.client_certificate(
            "multus", f"system:multus:{NODE}", ["system:multus"]
        )
        plexus_pem = cluster.client_certificate("plexus", f"plexus:{NODE}", ["plexus:nodes"])
        certs = root / "multus-certs"
        certs.mkdir()
        # Where its certificate store looks first: a current cert means no CSR is needed.
        shutil.copy(multus_pem, certs / "multus-client-current.pem")
        self.multus_kubeconfig = cluster.kubeconfig_of(multus_pem, root / "multus.kubeconfig")
        self.daemons = {
            "multus thick": stack.enter_context(self.multus_daemon(certs)),
            "plexus daemon": stack.enter_context(
                self.plexus_daemon(cluster.kubeconfig_of(plexus_pem, root / "plexus.kubeconfig"))
            ),
        }
        self.uids: dict[str, str] = {}

    def api(self, method: str, resource: str, body: dict[str, Any]) -> dict[str, Any]:
        path = f"/api/v1/namespaces/{NAMESPACE}/{resource}"
        if resource == "network-attachment-definitions":
            path = f"/apis/k8s.cni.cncf.io/v1/namespaces/{NAMESPACE}/{resource}"
        result: dict[str, Any] = self.cluster.request(method, path, body)
        return result

    def net_dir(self, name: str) -> Path:
        """A net.d holding the default network alone, for one daemon to wrap."""
        path = self.bench.root / name
        path.mkdir()
        (path / "10-bench.conf").write_text(json.dumps(self.bench.bridge()))
        return path

    @contextmanager
    def multus_daemon(self, certs: Path) -> Iterator[Daemon]:
        root = self.bench.root
        net_dir, sockets = self.net_dir("multus-net.d"), root / "multus-run"
        config = root / "multus-daemon.json"
        bootstrap = self.multus_kubeconfig  # read for its server and inline CA
        config.write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "multusConfigFile": "auto",
                    "multusAutoconfigDir": str(net_dir),  # where the primary is found
                    "cniConfigDir": str(net_dir),  # where 00-multus.conf goes
                    "binDir": str(self.bench.bin),
                    "cniDir": str(root / "multus-cache"),
                    "socketDir": str(sockets),
                    "daemonSocketDir": str(sockets),
                    "logLevel": "error",
                    "logToStderr": True,
                    "perNodeCertificate": {
                        "enabled": True,
                        "bootstrapKubeconfig": str(bootstrap),
                        "certDir": str(certs),
                    },
                }
            )
        )
        daemon = Daemon(
            "multus-daemon",
            [str(GO_TOOLS / "multus-daemon"), "--config", str(config)],
            {"MULTUS_NODE_NAME": NODE},
            net_dir / "00-multus.conf",
            root / "multus-daemon.log",
        )
        try:
            yield daemon
        finally:
            daemon.stop()

    @contextmanager
    def plexus_daemon(self, config_path: Path) -> Iterator[Daemon]:
        root = self.bench.root
        net_dir = self.net_dir("plexus-net.d")
        config = root / "plexus-daemon.json"
        config.write_text(
            json.dumps(
                {
                    "cniVersion": "1.0.0",
                    "name": "plexus",
                    "type": "plexus",
                    "kubeconfig": str(config_path),
                    "cniConfigDir": str(net_dir),
                    "binDir": str(self.bench.bin),
                    "cniDir": str(root / "plexus-cache"),
                    "socketDir": str(root / "plexus-run"),
                    "metricsPort": 0,
                    "logToStderr": True,
                    "allowedHostPaths": [str(self.bench.root)],  # the NADs' leases
                }
            )
        )
        plexus = Path(sys.executable).parent / "plexus"
        daemon = Daemon(
            "plexus daemon",
            [str(plexus), "daemon", "--config", str(config), "--node-name", NODE],
            {},
            net_dir / "00-plexus.conflist",
            root / "plexus-daemon.log",
        )
        try:
            yield daemon
        finally:
            daemon.stop()

    def thin_conf(self) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": "multus-thin",
            "type": "multus",
            "kubeconfig": str(self.multus_kubeconfig),
            "delegates": [self.bench.bridge()],
            "binDir": str(self.bench.bin),
            "cniDir": str(self.bench.root / "multus-thin"),
            "logLevel": "panic",
        }

    def pod(self, name: str, extras: int) -> str:
        """Create a pod on this node whose annotation asks for `extras` macvlans; CNI_ARGS."""
        created = self.api(
            "POST",
            "pods",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "annotations": {
                        "k8s.v1.cni.cncf.io/networks": ",".join(f"mv{i}" for i in range(extras))
                    },
                },
                "spec": {"nodeName": NODE, "containers": [{"name": "app", "image": "pause"}]},
            },
        )
        uid = created["metadata"]["uid"]
        return (
            f"IgnoreUnknown=1;K8S_POD_NAMESPACE={NAMESPACE};K8S_POD_NAME={name};K8S_POD_UID={uid}"
        )

    def binary(self, name: str) -> tuple[str, dict[str, Any]]:
        """What a runtime execs for an API-backed contender, and the conf it sends."""
        if name == "multus thin":
            return str(GO_TOOLS / "multus"), self.thin_conf()
        shim = GO_TOOLS / "multus-shim" if name == "multus thick" else self.bench.bin / "plexus"
        return str(shim), self.daemons[name].conf

    def contenders(self, extras: int) -> dict[str, Callable[[], float]]:
        """Each contender's timed ADD (+ untimed DEL), each with a pod of its own."""
        runs: dict[str, Callable[[], float]] = {
            "raw delegates": partial(raw_add, self.bench, extras)
        }
        for name in AGENTS:
            args = self.pod(f"{slug(name)}-n{extras}", extras)
            runs[name] = partial(one_add, self.bench, *self.binary(name), args)
        return runs

    def requests_per_add(self, extras: int) -> dict[str, dict[str, float]]:
        """API requests per ADD by verb, from the audit log, for each API-backed contender."""
        counts: dict[str, dict[str, float]] = {}
        for name, agent in AGENTS.items():
            binary, conf = self.binary(name)
            args = self.pod(f"audit-{slug(name)}-n{extras}", extras)
            time.sleep(SETTLE)
            before = len(audit_events(self.cluster.audit_log, agent))
            pods = []
            for _ in range(AUDIT_ADDS):
                netns = f"/run/netns/{self.bench.pod()}"
                cid = f"audit-{self.bench.tag}-{self.bench.count}"
                self.bench.call("ADD", binary, conf, cid, netns, args=args)
                pods.append((cid, netns))
            time.sleep(SETTLE)  # Multus sends its Events after answering
            verbs = collections.Counter(
                e["verb"] for e in audit_events(self.cluster.audit_log, agent)[before:]
            )
            counts[name] = {v: verbs[v] / AUDIT_ADDS for v in VERBS}
            for cid, netns in pods:
                self.bench.call("DEL", binary, conf, cid, netns, args=args)
                sh("ip", "netns", "del", netns.rsplit("/", 1)[1])
        return counts

    def warmed(self, name: str) -> float:
        """RSS (MiB) of a daemon after WARM_ADDS sequential ADDs with one secondary network."""
        binary, conf = self.binary(name)
        args = self.pod(f"warm-{slug(name)}", 1)
        time.sleep(SETTLE)
        for _ in range(WARM_ADDS):
            one_add(self.bench, binary, conf, args)
        time.sleep(SETTLE)
        return rss(self.daemons[name].proc.pid)

    def burst(self, name: str) -> tuple[float, int]:
        """Peak RSS (MiB) of a daemon over BURST concurrent pod ADDs, and how many failed."""
        binary, conf = self.binary(name)
        pid = self.daemons[name].proc.pid
        calls = []
        for i in range(BURST):
            args = self.pod(f"burst-{slug(name)}-{i}", 1)
            calls.append((f"burst-{self.bench.tag}-{i}", f"/run/netns/{self.bench.pod()}", args))
        time.sleep(SETTLE)
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # reset the peak to the current RSS
        failed = run_all(self.bench, "ADD", binary, conf, calls)
        peak = rss(pid, "VmHWM")
        run_all(self.bench, "DEL", binary, conf, calls)
        for _, netns, _ in calls:
            sh("ip", "netns", "del", netns.rsplit("/", 1)[1])
        return peak, failed


def run_all(
    bench: Bench, verb: str, binary: str, conf: dict[str, Any], calls: list[tuple[str, str, str]]
) -> int:
    """Exec `binary` once per (cid, netns, CNI_ARGS), all at the same time; count failures."""
    data = json.dumps(conf).encode()
    procs = []
    for cid, netns, args in calls:
        proc = subprocess.Popen(
            [binary],
            env=bench.env(verb, cid, netns, args=args),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(proc)
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(data)
        proc.stdin.close()
    return sum(proc.wait() != 0 for proc in procs)


def measure(bench: Bench, runs: int, extras_list: list[int]) -> dict[str, Any]:
    """Everything, from inside the node namespace."""
    with ExitStack() as stack:
        cluster = stack.enter_context(Cluster.running())
        thick = Thick(bench, cluster, stack)
        time.sleep(SETTLE)
        idle = {name: rss(d.proc.pid) for name, d in thick.daemons.items()}
        warm = {name: thick.warmed(name) for name in thick.daemons}
        rows, api = [], {}
        for extras in extras_list:
            contenders = thick.contenders(extras)
            time.sleep(SETTLE)
            samples: dict[str, list[float]] = {name: [] for name in contenders}
            base = []
            for run in contenders.values():
                run()  # warm-up, not counted
            for _ in range(runs):
                base.append(baseline(bench))
                for name, run in contenders.items():
                    samples[name].append(run())
                    time.sleep(QUIET)
            offset = statistics.median(base)
            medians = {name: statistics.median(v) - offset for name, v in samples.items()}
            rows.append({"extras": extras, "baseline_ms": offset, **medians})
            api[extras] = thick.requests_per_add(extras)
        peaks = {name: thick.burst(name) for name in thick.daemons}
    return {"rows": rows, "api": api, "idle": idle, "warm": warm, "peaks": peaks, "runs": runs}


def render(result: dict[str, Any]) -> str:
    rows = result["rows"]
    names = [k for k in rows[0] if k not in ("extras", "baseline_ms")]
    first = rows[0]
    lines = [
        "| secondary macvlans | "
        + " | ".join(f"{n} (ms)" for n in names)
        + " | plexus/thick | per extra network: plexus vs thick (ms) |",
        "|---" * (len(names) + 3) + "|",
    ]
    for row in rows:
        ratio = row["plexus daemon"] / row["multus thick"]
        extra = ""
        if row["extras"] > first["extras"]:
            n = row["extras"] - first["extras"]
            extra = " vs ".join(
                f"{(row[c] - first[c]) / n:.1f}" for c in ("plexus daemon", "multus thick")
            )
        cells = " | ".join(f"{row[n]:.1f}" for n in names)
        lines.append(f"| {row['extras']} | {cells} | {ratio:.2f}x | {extra} |")
    lines += [
        "",
        f"medians of {result['runs']} interleaved rounds; `ip netns exec` baseline "
        f"({first['baseline_ms']:.1f} ms) subtracted",
        "",
        f"| daemon | idle RSS (MiB) | after {WARM_ADDS} ADDs (MiB) "
        f"| peak RSS over {BURST} concurrent ADDs (MiB) | failed ADDs |",
        "|---|---|---|---|---|",
    ]
    for name, idle in result["idle"].items():
        peak, failed = result["peaks"][name]
        lines.append(
            f"| {name} | {idle:.1f} | {result['warm'][name]:.1f} | {peak:.1f} | {failed} |"
        )
    lines += [
        "",
        "| API requests per ADD | secondary macvlans | " + " | ".join(VERBS) + " |",
        "|---" * (len(VERBS) + 2) + "|",
    ]
    for extras, counts in result["api"].items():
        for name, verbs in counts.items():
            cells = " | ".join(f"{verbs[v]:g}" for v in VERBS)
            lines.append(f"| {name} | {extras} | {cells} |")
    return "\n".join(lines)


def main() -> None:
    args = arguments(__doc__)
    tools = ("etcd", "kube-apiserver", "multus", "multus-daemon", "multus-shim")
    print(render(in_bench("bench_thick", tools, lambda b: measure(b, args.runs, args.extras))))


if __name__ == "__main__":
    main()

"""`make demo` (`python -m tests.demo`): two namespace "pods" on two networks, no Kubernetes.

A "node" namespace holds the default network's bridge and a veth uplink that
is the macvlan master; the pods get eth0 from reference bridge + host-local and
net1 from reference macvlan via a NAD in an embedded store. The `plexus` binary
is exec'd exactly as a runtime would exec it, and forwards each call to the node
daemon, which runs the engine.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from meta.install import install_binaries

REFERENCE_PLUGINS = "/usr/lib/cni"
NODE = "plexus-demo-node"
UPLINK = "demo-uplink"
PODS = ("pod-a", "pod-b")
ANNOTATIONS = {
    "pod-a": "macvlan-dhcp@net1",  # comma form
    "pod-b": json.dumps(
        [{"name": "macvlan-static", "interface": "net1", "ips": ["10.77.2.50/24"]}]
    ),
}


def _sh(*cmd: str, netns: str = "", check: bool = True) -> subprocess.CompletedProcess[str]:
    full = ["ip", "netns", "exec", netns, *cmd] if netns else list(cmd)
    return subprocess.run(full, check=check, capture_output=True, text=True)


def _say(text: str = "") -> None:
    print(text, flush=True)


def _cluster_objects(data_dir: Path) -> dict[str, dict[str, Any]]:
    def nad(name: str, ipam: dict[str, Any], caps: dict[str, bool] | None = None) -> dict[str, Any]:
        config: dict[str, Any] = {
            "cniVersion": "1.0.0",
            "type": "macvlan",
            "master": UPLINK,
            "mode": "bridge",
            "ipam": ipam,
        }
        if caps:
            config["capabilities"] = caps
        return {
            "apiVersion": "k8s.cni.cncf.io/v1",
            "kind": "NetworkAttachmentDefinition",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"config": json.dumps(config)},
        }

    objects = {
        "nad-macvlan-dhcp.yaml": nad(
            "macvlan-dhcp",
            {
                "type": "host-local",
                "dataDir": str(data_dir),
                "ranges": [
                    [
                        {
                            "subnet": "10.77.2.0/24",
                            "rangeStart": "10.77.2.10",
                            "rangeEnd": "10.77.2.40",
                        }
                    ]
                ],
            },
        ),
        "nad-macvlan-static.json": nad("macvlan-static", {"type": "static"}, {"ips": True}),
    }
    for pod, value in ANNOTATIONS.items():
        objects[f"{pod}.yaml"] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod,
                "namespace": "default",
                "uid": f"uid-{pod}",
                "annotations": {"k8s.v1.cni.cncf.io/networks": value},
            },
            "spec": {"nodeName": "demo-node", "containers": [{"name": "app", "image": "pause"}]},
        }
    return objects


def _meta_config(root: Path) -> dict[str, Any]:
    return {
        "cniVersion": "1.1.0",
        "name": "plexus",
        "type": "plexus",
        "clusterDir": str(root / "cluster"),
        "cniDir": str(root / "cni"),
        "socketDir": str(root / "run"),
        "metricsPort": 0,
        "logFile": str(root / "plexus.log"),
        "logToStderr": False,
        "allowedHostPaths": [str(root)],  # the demo's NADs keep their leases under it
        "delegates": [
            {
                "cniVersion": "1.0.0",
                "name": "default-net",
                "type": "bridge",
                "bridge": "plexus-br0",
                "isGateway": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(root / "ipam"),
                    "ranges": [[{"subnet": "10.77.1.0/24"}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }
        ],
    }


def _cni(root: Path, verb: str, pod: str) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "CNI_COMMAND": verb,
        "CNI_CONTAINERID": f"demo-{pod}",
        "CNI_NETNS": f"/run/netns/plexus-demo-{pod}",
        "CNI_IFNAME": "eth0",
        "CNI_PATH": str(root / "bin"),
        "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME={pod};"
        f"K8S_POD_INFRA_CONTAINER_ID=demo-{pod};K8S_POD_UID=uid-{pod}",
    }
    return subprocess.run(
        ["ip", "netns", "exec", NODE, str(root / "bin" / "plexus")],
        input=json.dumps(_meta_config(root)),
        env=env,
        capture_output=True,
        text=True,
    )


def _setup(root: Path) -> None:
    bin_dir = root / "bin"
    bin_dir.mkdir()
    for plugin in sorted(os.listdir(REFERENCE_PLUGINS)):
        (bin_dir / plugin).symlink_to(Path(REFERENCE_PLUGINS) / plugin)
    install_binaries(bin_dir)
    cluster = root / "cluster"
    cluster.mkdir()
    for name, obj in _cluster_objects(root / "ipam-net1").items():
        text = json.dumps(obj, indent=2) if name.endswith(".json") else yaml.safe_dump(obj)
        (cluster / name).write_text(text)
    for stale in (NODE, *(f"plexus-demo-{pod}" for pod in PODS)):
        _sh("ip", "netns", "del", stale, check=False)  # left by an interrupted demo
    _sh("ip", "netns", "add", NODE)
    _sh("ip", "link", "set", "lo", "up", netns=NODE)
    _sh("ip", "link", "add", UPLINK, "type", "veth", "peer", "name", f"{UPLINK}-p", netns=NODE)
    for link in (UPLINK, f"{UPLINK}-p"):
        _sh("ip", "link", "set", link, "up", netns=NODE)
    for pod in PODS:
        _sh("ip", "netns", "add", f"plexus-demo-{pod}")
        _sh("ip", "link", "set", "lo", "up", netns=f"plexus-demo-{pod}")


def _start_daemon(root: Path) -> subprocess.Popen[bytes]:
    """The node daemon in the node namespace; the shim finds it through socketDir."""
    config = root / "daemon.json"
    config.write_text(json.dumps(_meta_config(root)))
    plexus = Path(sys.executable).parent / "plexus"
    daemon = subprocess.Popen(
        ["ip", "netns", "exec", NODE, str(plexus), "daemon", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    socket = root / "run" / "plexus.sock"
    deadline = time.monotonic() + 30
    while not socket.exists():
        if daemon.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the plexus daemon did not start; see {root / 'plexus.log'}")
        time.sleep(0.05)
    return daemon


def _stop_daemon(daemon: subprocess.Popen[bytes] | None) -> None:
    if daemon is not None and daemon.poll() is None:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=60)


def _teardown(root: Path, daemon: subprocess.Popen[bytes] | None) -> None:
    for pod in PODS:
        _cni(root, "DEL", pod)
        _sh("ip", "netns", "del", f"plexus-demo-{pod}", check=False)
    _stop_daemon(daemon)
    _sh("ip", "netns", "del", NODE, check=False)
    shutil.rmtree(root, ignore_errors=True)


def _status_of(root: Path, pod: str) -> list[dict[str, Any]]:
    obj = yaml.safe_load((root / "cluster" / f"{pod}.yaml").read_text())
    value = obj["metadata"]["annotations"].get("k8s.v1.cni.cncf.io/network-status", "[]")
    return list(json.loads(value))


def _set_networks(root: Path, pod: str, value: str) -> None:
    """Edit the pod's networks annotation in its manifest, as `kubectl annotate` would."""
    path = root / "cluster" / f"{pod}.yaml"
    obj = yaml.safe_load(path.read_text())
    obj["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] = value
    path.write_text(yaml.safe_dump(obj))


def _hotplug(root: Path, pod: str, value: str, interfaces: list[str]) -> bool:
    """Change the annotation; wait for the daemon to make `interfaces` the pod's."""
    _set_networks(root, pod, value)
    _say(f"\nhot-plug: {pod} annotation now {value!r}")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        status = [s["interface"] for s in _status_of(root, pod)]
        if status == interfaces:
            links = _sh("ip", "-o", "link", "show", netns=f"plexus-demo-{pod}").stdout
            names = sorted(line.split(":")[1].strip().split("@")[0] for line in links.splitlines())
            _say(f"  network-status interfaces {status}; links in the pod {names}")
            return names == sorted(["lo", *interfaces])
        time.sleep(0.2)
    _say(f"  FAILED: network-status still lists {status}")
    return False


def _ping(src: str, address: str) -> bool:
    return (
        _sh(
            "ping", "-c", "1", "-W", "2", address, netns=f"plexus-demo-{src}", check=False
        ).returncode
        == 0
    )


def run_demo() -> int:
    """Attach, show, ping, check, detach; returns the exit status."""
    if os.geteuid() != 0:
        _say("the demo needs root (it creates network namespaces)")
        return 1
    if not os.path.isdir(REFERENCE_PLUGINS):
        _say(f"the demo needs the reference CNI plugins in {REFERENCE_PLUGINS} (make setup)")
        return 1
    root = Path(tempfile.mkdtemp(prefix="plexus-demo-"))
    ok = True
    daemon = None
    try:
        _setup(root)
        daemon = _start_daemon(root)
        _say(f"Plexus demo in {root}: node netns {NODE}, pods {', '.join(PODS)}")
        _say(f"node daemon pid {daemon.pid} on {root / 'run' / 'plexus.sock'}; the runtime's")
        _say("side is the compiled `plexus` shim, exec'd with the CNI env as containerd does\n")
        for pod in PODS:
            _say(f"ADD {pod}  (annotation: {ANNOTATIONS[pod]})")
            start = time.perf_counter()
            done = _cni(root, "ADD", pod)
            took = (time.perf_counter() - start) * 1000
            if done.returncode != 0:
                _say(f"  failed: {done.stdout.strip()} {done.stderr.strip()}")
                return 1
            result = json.loads(done.stdout)
            addresses_eth0 = [ip["address"] for ip in result["ips"]]
            _say(f"  result to the runtime (eth0): {addresses_eth0}, {took:.0f} ms")
        addresses: dict[str, dict[str, str]] = {}
        for pod in PODS:
            status = _status_of(root, pod)
            _say(f"\n{pod} k8s.v1.cni.cncf.io/network-status:\n{json.dumps(status, indent=2)}")
            addresses[pod] = {s["interface"]: s["ips"][0] for s in status}
        _say("")
        for src, dst in (("pod-a", "pod-b"), ("pod-b", "pod-a")):
            for ifname in ("eth0", "net1"):
                reached = _ping(src, addresses[dst][ifname])
                ok &= reached
                _say(
                    f"ping {src} -> {dst} {ifname} {addresses[dst][ifname]}: "
                    f"{'ok' if reached else 'FAILED'}"
                )
        ok &= _hotplug(
            root, "pod-a", f"{ANNOTATIONS['pod-a']},macvlan-dhcp@net2", ["eth0", "net1", "net2"]
        )
        ok &= _hotplug(root, "pod-a", ANNOTATIONS["pod-a"], ["eth0", "net1"])
        for pod in PODS:
            checked = _cni(root, "CHECK", pod)
            ok &= checked.returncode == 0
            _say(f"CHECK {pod}: {'ok' if checked.returncode == 0 else checked.stdout.strip()}")
        for pod in PODS:
            deleted = _cni(root, "DEL", pod)
            ok &= deleted.returncode == 0
            _say(f"DEL {pod}: {'ok' if deleted.returncode == 0 else deleted.stdout.strip()}")
        links = _sh("ip", "-o", "link", "show", netns="plexus-demo-pod-a").stdout.splitlines()
        left = [line for line in links if ": lo:" not in line]
        ok &= not left
        _say(f"pod-a after DEL: {left or 'only lo'}")
        log_lines = (root / "plexus.log").read_text().splitlines()
        _say(f"\n{len(log_lines)} structured log lines, the first ADD's steps:")
        for line in log_lines[:6]:
            _say(f"  {line}")
    finally:
        _teardown(root, daemon)
    _say(f"\ndemo {'passed' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(run_demo())

"""A real node for the cluster tier: kubelet -> containerd (CRI) -> `plexus` -> the daemon.

`KubeletNode.start()` builds, under one short temp dir (unix socket paths are short):
- a node network namespace (tests/netns/conftest.py's `Node`: the bridge's home, the
  macvlan master `uplink0`, the reference plugins and Plexus's installed binaries), plus a
  veth `kubenode0` holding the node IP (the kubelet refuses a loopback node IP);
- a relay from the node namespace's 127.0.0.1:<apiserver port> to the host's
  (tests/cluster/forward.py), so the kubeconfigs work unchanged in there;
- the CNI conf dir with the primary network (`10-default.conflist`: reference bridge +
  host-local) and `plexus daemon` on its Kubernetes source with `cniConfigDir` set, so it
  writes `00-plexus.conflist` wrapping the primary, exactly as on a real node;
- containerd with the CRI plugin (tests/runtime/containerd.py) in the node namespace, its
  `conf_dir` that dir and the locally built pause image imported;
- the kubelet, in the node namespace too, with a node client certificate
  (`system:node:<name>` in `system:nodes`; the test apiserver authorizes with RBAC only,
  no Node authorizer, so a ClusterRoleBinding gives that user the `system:node` role), its
  `--root-dir`, `--cert-dir`, pod logs and a KubeletConfiguration file in the temp dir,
  `containerRuntimeEndpoint` our containerd. It is ready when its Node is Ready.

The kubelet serves device plugins at the fixed /var/lib/kubelet/device-plugins (not under
its --root-dir), and insists on six host-wide sysctls (overcommit_memory=1, panic_on_oops=1,
kernel.panic=10, ...) and, with protectKernelDefaults false, writes them to the host
kernel; with it true it refuses to start. Neither is acceptable on a shared machine, so
containerd and the kubelet run in the node's own mount namespace (tests/cluster/mounts.py)
where those six /proc/sys files are FAKE (read-only bind mounts of files holding the values
it wants), its root dir's `device-plugins` is bound over the fixed path, and the node's
dirs are bound over the host paths a DaemonSet of Plexus mounts (`/opt/cni/bin`,
`/etc/cni/net.d`, `/run/plexus`, ...). Sharing that namespace, containerd sees the
kubelet's volume mounts (a pod's service-account token). Nothing of the host's kernel
changes, and on the host only those paths' (empty) directories are made, if absent.

`close()` undoes it all even after a failure: pods bound to the node force-deleted in the
API, the kubelet stopped by PID, every sandbox stopped and removed through CRI,
containerd stopped by PID (and its shims), the daemon stopped, sandbox netns, libcni
results, mounts and cgroups removed, the mount namespace dropped, the Node object deleted,
the temp dir removed.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import yaml
from cri_api.v1 import api_pb2 as cri

from delegates.netns import run_in_netns
from meta.daemon.config import GENERATED_NAME, NETWORK_NAME
from tests.cluster.apiserver import (
    ApiError,
    Cluster,
    binary,
    free_ports,
)
from tests.cluster.forward import LoopbackForward
from tests.cluster.mounts import NodeMounts
from tests.netns.conftest import Node, sh
from tests.netns.daemon import PLEXUS, Daemon
from tests.runtime import containerd as ctrd
from tests.runtime.image import NAME as PAUSE_IMAGE
from tests.runtime.image import build_pause_image
from tests.unit.deviceplugin.fake_sysfs import FakeSysfs

KUBELET = binary("kubelet")
NODE_IP = "192.0.2.10"  # TEST-NET-1, on the node namespace's `kubenode0` only
NODE_LINK = "kubenode0"
NETNS_DIR = Path("/run/netns")
# The kubelet serves device plugins at this fixed path whatever its --root-dir (the
# v1beta1 API's DevicePluginPath); in its mount namespace our dir is bound over it.
HOST_DEVICE_PLUGINS_DIR = Path("/var/lib/kubelet/device-plugins")
# Directories made outside the temp dir (by containerd, libcni, or as the mount point
# above): removed after the node if they were absent before it and are empty.
HOST_POD_RESOURCES_DIR = Path("/var/lib/kubelet/pod-resources")
KUBELET_TIMEOUT = 90.0
POD_TIMEOUT = 60.0
NETWORKS = "k8s.v1.cni.cncf.io/networks"
STATUS = "k8s.v1.cni.cncf.io/network-status"
RESOURCE_ANNOTATION = "k8s.v1.cni.cncf.io/resourceName"

# What kubelet's cm.setupKernelTunables wants to read (the FAKE /proc/sys files).
KERNEL_TUNABLES = {
    "vm/overcommit_memory": 1,
    "vm/panic_on_oom": 0,
    "kernel/panic": 10,
    "kernel/panic_on_oops": 1,
    "kernel/keys/root_maxkeys": 1000000,
    "kernel/keys/root_maxbytes": 25000000,
}

Json = dict[str, Any]


class KubeletError(RuntimeError):
    """The kubelet (or the node under it) did not come up; the message has the log tails."""


def missing_binaries() -> list[str]:
    """What this harness needs beyond the control plane, if absent."""
    absent = [str(KUBELET)] if not KUBELET.exists() else []
    return (
        absent
        + ctrd.missing()
        + [b for b in ("setpriv", "unshare", "nsenter") if not shutil.which(b)]
    )


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class NodeDaemon(Daemon):
    """`plexus daemon` in the node namespace under the kubelet's node name (informers
    select pods by `spec.nodeName`), its stderr kept in a log file."""

    def __init__(self, node: Node, node_name: str, **extra: Any) -> None:
        super().__init__(node, **extra)
        self.node_name = node_name
        self.stderr = node.root / "daemon.stderr"

    def start(self) -> None:
        with self.stderr.open("ab") as err:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", self.node.name, PLEXUS, "daemon",
                 "--config", str(self.config), "--node-name", self.node_name],
                stdout=subprocess.DEVNULL,
                stderr=err,
            )  # fmt: skip
        deadline = time.monotonic() + 30
        while not self._ready():
            if self.proc.poll() is not None:
                raise KubeletError(f"plexus daemon exited at start-up:\n{tail(self.stderr)}")
            if time.monotonic() > deadline:
                raise KubeletError(f"plexus daemon not ready after 30 s:\n{tail(self.stderr)}")
            time.sleep(0.05)


class Kubelet:
    """One kubelet process in the node namespace, started and stopped by PID."""

    def __init__(
        self,
        root: Path,
        name: str,
        netns: str,
        runtime_socket: Path,
        enter: list[str],
        node_ip: str = NODE_IP,
        max_pods: int = 16,
    ) -> None:
        self.root = root
        self.enter = enter  # the command prefix entering the node's mount namespace
        self.name = name
        self.netns = netns
        self.runtime_socket = runtime_socket
        self.node_ip = node_ip
        self.max_pods = max_pods
        self.root_dir = root / "root"
        self.cert_dir = root / "pki"
        self.config = root / "config.yaml"
        self.kubeconfig = root / "kubeconfig"
        self.log = root / "kubelet.log"
        self.cgroup_root = f"/{name}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.port, self.healthz_port = run_in_netns(f"/run/netns/{netns}", _two_free_ports)

    @property
    def device_plugins_dir(self) -> Path:
        return self.root_dir / "device-plugins"

    @property
    def plugins_registry_dir(self) -> Path:
        """Where the kubelet's plugin watcher looks for plugin sockets."""
        return self.root_dir / "plugins_registry"

    @property
    def pod_resources_socket(self) -> Path:
        return self.root_dir / "pod-resources" / "kubelet.sock"

    def fake_sysctls(self) -> dict[Path, Path]:
        """FAKE file -> the /proc/sys file it stands for in the node's mount namespace."""
        return {self._fake_sysctl(key): Path("/proc/sys") / key for key in KERNEL_TUNABLES}

    def _fake_sysctl(self, key: str) -> Path:
        return self.root / "sysctl" / key

    def write_files(self, cluster: Cluster) -> None:
        """The node's client certificate and kubeconfig, the config and the FAKE sysctls."""
        assert cluster.pki is not None
        crt, key = cluster.pki._leaf(
            f"kubelet-{self.name}", f"/O=system:nodes/CN=system:node:{self.name}", "clientAuth"
        )
        user = f"system:node:{self.name}"
        cluster_entry = {"server": cluster.server, "certificate-authority": str(cluster.pki.ca_crt)}
        kubeconfig = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "plexus-test", "cluster": cluster_entry}],
            "users": [
                {"name": user, "user": {"client-certificate": str(crt), "client-key": str(key)}}
            ],
            "contexts": [{"name": "node", "context": {"cluster": "plexus-test", "user": user}}],
            "current-context": "node",
        }
        self.kubeconfig.write_text(yaml.safe_dump(kubeconfig, sort_keys=False))
        config = self.configuration()
        config["authentication"]["x509"] = {"clientCAFile": str(cluster.pki.ca_crt)}
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        for tunable, value in KERNEL_TUNABLES.items():
            fake = self._fake_sysctl(tunable)
            fake.parent.mkdir(parents=True, exist_ok=True)
            fake.write_text(f"{value}\n")

    def configuration(self) -> Json:
        disabled = "0%"  # an eviction threshold of 0% is ignored
        return {
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "address": "127.0.0.1",
            "port": self.port,
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": self.healthz_port,
            "authentication": {
                "anonymous": {"enabled": False},
                "webhook": {"enabled": False},
                "x509": {},
            },
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.runtime_socket}",
            "cgroupDriver": "cgroupfs",
            # QoS cgroups under our own root (made in start()), so every pod cgroup is
            # below it and removed with it; nothing is enforced on them.
            "cgroupsPerQOS": True,
            "cgroupRoot": self.cgroup_root,
            "enforceNodeAllocatable": [],
            "failCgroupV1": False,
            "failSwapOn": False,
            "protectKernelDefaults": False,
            "makeIPTablesUtilChains": False,
            "localStorageCapacityIsolation": False,
            "oomScoreAdj": 0,
            "evictionHard": {
                "memory.available": disabled,
                "nodefs.available": disabled,
                "nodefs.inodesFree": disabled,
                "imagefs.available": disabled,
                "imagefs.inodesFree": disabled,
            },
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "podLogsDir": str(self.root / "pod-logs"),
            "resolvConf": "",
            "serializeImagePulls": False,
            "nodeStatusUpdateFrequency": "1s",
            "nodeStatusReportFrequency": "5m",
            "syncFrequency": "10s",
            "fileCheckFrequency": "1h",
            "registerNode": True,
            "maxPods": self.max_pods,
        }

    def command(self) -> list[str]:
        """The kubelet in the node's mount namespace and netns."""
        return [
            # PDEATHSIG from setpriv, not a preexec_fn: a Python fork with gRPC's
            # threads running (our CRI channel) aborts in the child.
            "setpriv", "--pdeathsig", "KILL", "--",
            *self.enter, f"--net={NETNS_DIR / self.netns}", "--",
            str(KUBELET),
            f"--config={self.config}",
            f"--kubeconfig={self.kubeconfig}",
            f"--root-dir={self.root_dir}",
            f"--cert-dir={self.cert_dir}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.node_ip}",
            "--v=2",
        ]  # fmt: skip

    def start(self) -> None:
        self.root_dir.mkdir(exist_ok=True)
        self.device_plugins_dir.mkdir(exist_ok=True)
        for hierarchy in Path("/sys/fs/cgroup").iterdir():  # cgroupRoot must exist
            if (hierarchy / "cgroup.procs").exists() or (hierarchy / "tasks").exists():
                (hierarchy / self.cgroup_root.strip("/")).mkdir(exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=self.root,
            )

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """SIGTERM by PID, SIGKILL after 20 s."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        self.proc = None

    def log_tail(self, lines: int = 40) -> str:
        return tail(self.log, lines)


def run_all(steps: list[Callable[[], object]]) -> None:
    """Run every teardown step even if an earlier one failed; raise the first error."""
    errors: list[BaseException] = []
    for step in steps:
        try:
            step()
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


def reserved_ips(store: Path) -> list[str]:
    """The addresses a host-local store (its dataDir) holds, in any range."""
    found = []
    for path in store.rglob("*"):
        with contextlib.suppress(ValueError):
            found.append(str(ipaddress.ip_address(path.name)))
    return sorted(found)


def _two_free_ports() -> tuple[int, int]:
    first, second = free_ports(2)
    return first, second


class KubeletNode:
    """The whole node: netns, API relay, Plexus daemon, containerd and kubelet.

    Several can join one cluster: each has its own names, dirs, sockets, `node_ip`,
    primary pod subnet (`pod_subnet`, default Node.bridge_conf()'s) and containerd
    `release` (2.x by default; Debian's 1.6 for the other node of a mixed cluster)."""

    def __init__(
        self,
        cluster: Cluster,
        node_ip: str = NODE_IP,
        pod_subnet: str = "",
        max_pods: int = 16,
        release: ctrd.Release = ctrd.BUILT,
    ) -> None:
        self.cluster = cluster
        self.node_ip = node_ip
        self.pod_subnet = pod_subnet
        # Unix socket paths (device plugins, CRI) must stay short: not pytest's tmp dirs.
        self.root = Path(tempfile.mkdtemp(prefix="pxk-"))
        (self.root / "node").mkdir()
        self.node = Node(self.root / "node")
        try:
            self._setup(max_pods, release)
        except BaseException:
            self.node.close()
            shutil.rmtree(self.root, ignore_errors=True)
            raise

    def _setup(self, max_pods: int, release: ctrd.Release) -> None:
        self.name = f"pxt-kubelet-{self.node.tag}"
        self.net_dir = self.root / "net.d"
        # The node's own /run and /var/lib/cni (its mount namespace has them there), with
        # Plexus's state where a DaemonSet puts it; the hand-started daemon uses them too.
        self.run_dir = self.root / "run"
        self.var_lib_cni = self.root / "var-lib-cni"
        self.cni_state = self.var_lib_cni / "plexus"
        self.devinfo_dir = self.run_dir / "k8s.cni.cncf.io" / "devinfo"
        self.forward: LoopbackForward | None = None
        self.daemon: NodeDaemon | None = None
        (self.root / "containerd").mkdir()
        (self.root / "kubelet").mkdir()
        self.mounts = NodeMounts(self.root)
        self.containerd = ctrd.Containerd(
            self.root / "containerd",
            self.node.name,
            self.node.bin,
            self.net_dir,
            cgroup_parent=f"/{self.name}",  # only for sandboxes run by hand, not the kubelet's
            enter=self.mounts.nsenter(),
            release=release,
            cdi_dirs=[self.root / "cdi"],  # where a DRA plugin of the node writes its specs
        )
        self.kubelet = Kubelet(
            self.root / "kubelet",
            self.name,
            self.node.name,
            self.containerd.socket,
            self.mounts.nsenter(),
            self.node_ip,
            max_pods,
        )
        self.startup_seconds = 0.0
        self._sandbox_netns: set[str] = set()  # every sandbox netns path seen, for cleanup

    # -- start ---------------------------------------------------------------------

    def start(self, with_daemon: bool = True) -> None:
        """Bring the node up to Ready; `with_daemon=False` leaves Plexus out (the node runs
        on its primary network until something installs Plexus, e.g. start_daemon())."""
        began = time.monotonic()
        sh("ip", "link", "add", NODE_LINK, "type", "veth", "peer", "name", "kubenode1",
           netns=self.node.name)  # fmt: skip
        sh("ip", "addr", "add", f"{self.node_ip}/24", "dev", NODE_LINK, netns=self.node.name)
        for link in (NODE_LINK, "kubenode1"):
            sh("ip", "link", "set", link, "up", netns=self.node.name)
        port = int(self.cluster.server.rsplit(":", 1)[1])
        self.forward = LoopbackForward(f"{NETNS_DIR / self.node.name}", port)
        self.forward.start()

        self.net_dir.mkdir()
        (self.net_dir / "10-default.conflist").write_text(json.dumps(self.primary_conflist()))
        if with_daemon:
            self.start_daemon()

        self.kubelet.write_files(self.cluster)
        self.make_mounts()
        self.containerd.start()
        self.containerd.import_image(build_pause_image(self.root))

        self.cluster.create(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            {
                "metadata": {"name": self.name},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "system:node",
                },
                "subjects": [
                    {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "User",
                        "name": f"system:node:{self.name}",
                    }
                ],
            },
        )
        self.kubelet.start()
        self.wait_node_ready()
        self.startup_seconds = time.monotonic() - began

    def make_mounts(self) -> None:
        """The node's mount namespace: the kubelet's FAKE sysctls and device-plugins dir,
        and the node's dirs at the host paths a DaemonSet of Plexus mounts."""
        self.mounts.create()
        for fake, real in self.kubelet.fake_sysctls().items():
            self.mounts.bind(fake, real, read_only=True)
        self.run_dir.mkdir(exist_ok=True)
        self.mounts.own_run(self.run_dir)
        for source, target in (
            (self.kubelet.device_plugins_dir, HOST_DEVICE_PLUGINS_DIR),
            (self.kubelet.pod_resources_socket.parent, HOST_POD_RESOURCES_DIR),
            (self.var_lib_cni, Path("/var/lib/cni")),
            (self.node.bin, Path("/opt/cni/bin")),
            (self.net_dir, Path("/etc/cni/net.d")),
        ):
            source.mkdir(parents=True, exist_ok=True)
            self.mounts.bind(source, target)

    def primary_conflist(self) -> Json:
        """The node's own pod network (reference bridge + host-local), which Plexus wraps."""
        bridge = self.node.bridge_conf()
        if self.pod_subnet:
            bridge["ipam"]["ranges"] = [[{"subnet": self.pod_subnet}]]
        return {"cniVersion": "1.0.0", "name": "default-net", "plugins": [bridge]}

    def start_daemon(self) -> None:
        """`plexus daemon` started by hand in the node namespace; returns once it has
        written the generated conflist."""
        self.daemon = NodeDaemon(self.node, self.name, **self.daemon_settings())
        self.daemon.start()
        self._wait("00-plexus.conflist", lambda: (self.net_dir / GENERATED_NAME).exists(), 30)

    def wait_cni_network(self, name: str) -> None:
        """Until containerd's CRI has loaded the network config named `name` (it re-reads
        its conf dir on its own; a pod started before would get the previous network)."""
        self.wait_for(
            f"containerd to load CNI network {name!r}",
            lambda: [net["Name"] for net in self.containerd.cni_networks()] == [name],
        )

    def daemon_settings(self) -> Json:
        return {
            # Node.meta()'s cniVersion is 1.1.0, which containerd 1.6's libcni cannot read;
            # the generated conflist takes the primary's version (1.0.0), which it can.
            "clusterDir": "",
            "kubeconfig": str(self.cluster.kubeconfig),
            "cniConfigDir": str(self.net_dir),
            "cniDir": str(self.cni_state),
            "socketDir": str(self.run_dir / "plexus"),
            "podResourcesSocket": str(self.kubelet.pod_resources_socket),
            # No checkpoint fallback: a pod's device IDs can only come from the kubelet's
            # PodResources API (the real kubelet's own checkpoint would do as well).
            "deviceCheckpointFile": str(self.root / "no-checkpoint"),
            "deviceInfoDir": str(self.devinfo_dir),
        }

    def _wait(self, what: str, ready: Callable[[], bool], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise KubeletError(f"{what} not there after {timeout:.0f} s\n{self.diagnostics()}")
            time.sleep(0.1)

    def node_object(self) -> Json | None:
        try:
            node: Json = self.cluster.get(f"/api/v1/nodes/{self.name}")
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        return node

    def conditions(self) -> dict[str, Json]:
        node = self.node_object() or {}
        return {c["type"]: c for c in node.get("status", {}).get("conditions", [])}

    def wait_node_ready(self, timeout: float = KUBELET_TIMEOUT) -> None:
        """Until the Node is Ready; a clear error (kubelet log tail) if it exits or times out."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.kubelet.running():
                code = self.kubelet.proc.returncode if self.kubelet.proc else None
                raise KubeletError(f"kubelet exited with {code}\n{self.diagnostics()}")
            ready = self.conditions().get("Ready", {})
            if ready.get("status") == "True":
                return
            if time.monotonic() > deadline:
                raise KubeletError(
                    f"node {self.name} not Ready after {timeout:.0f} s "
                    f"(Ready condition: {ready or 'no Node object'})\n{self.diagnostics()}"
                )
            time.sleep(0.2)

    def allocatable(self, resource: str) -> tuple[str, str]:
        """The Node's (capacity, allocatable) of `resource` ("" when absent)."""
        status = (self.node_object() or {}).get("status", {})
        return (
            status.get("capacity", {}).get(resource, ""),
            status.get("allocatable", {}).get(resource, ""),
        )

    def wait_allocatable(self, resource: str, count: str, extra_log: Path | None = None) -> None:
        """Until the Node's capacity and allocatable of `resource` are both `count`."""
        self.wait_for(
            f"node {self.name} to show {resource}: {count} (capacity, allocatable)",
            lambda: self.allocatable(resource) == (count, count),
            extra_log,
        )

    def wait_for(self, what: str, ready: Callable[[], bool], extra_log: Path | None = None) -> None:
        """Poll `ready()` (bounded); on timeout fail naming `what`, with the logs."""
        deadline = time.monotonic() + KUBELET_TIMEOUT
        while not ready():
            if time.monotonic() > deadline:
                extra = f"--- {extra_log.name}\n{tail(extra_log)}\n" if extra_log else ""
                raise AssertionError(
                    f"waited {KUBELET_TIMEOUT:.0f} s for {what}; last seen: "
                    f"{self.node_object()}\n{extra}{self.diagnostics()}"
                )
            time.sleep(0.2)

    def restart_kubelet(self) -> None:
        """Stop the kubelet by PID and start it again on the same root dir."""
        self.kubelet.stop()
        self.kubelet.start()

    def diagnostics(self) -> str:
        return (
            f"--- kubelet log (tail)\n{self.kubelet.log_tail()}\n"
            f"--- containerd log (tail)\n{self.containerd.log_tail(20)}\n"
            f"--- plexus daemon stderr (tail)\n{tail(self.node.root / 'daemon.stderr', 10)}\n"
            f"--- plexus log (tail)\n{tail(self.node.root / 'plexus.log', 20)}"
        )

    # -- what tests look at ----------------------------------------------------------

    def sandboxes(self, pod_uid: str = "", ready_only: bool = False) -> list[cri.PodSandbox]:
        """CRI sandboxes (of one pod, by the kubelet's UID label)."""
        labels = {"io.kubernetes.pod.uid": pod_uid} if pod_uid else {}
        state = (
            cri.PodSandboxStateValue(state=cri.PodSandboxState.SANDBOX_READY)
            if ready_only
            else None
        )
        done: cri.ListPodSandboxResponse = self.containerd.runtime.ListPodSandbox(
            cri.ListPodSandboxRequest(
                filter=cri.PodSandboxFilter(label_selector=labels, state=state)
            ),
            timeout=ctrd.CRI_TIMEOUT,
        )
        return list(done.items)

    def sandbox_netns(self, sandbox_id: str) -> str:
        path = self.containerd.netns_path(sandbox_id)
        self._sandbox_netns.add(path)
        return path

    def containers(self, sandbox_id: str) -> list[cri.Container]:
        done: cri.ListContainersResponse = self.containerd.runtime.ListContainers(
            cri.ListContainersRequest(filter=cri.ContainerFilter(pod_sandbox_id=sandbox_id)),
            timeout=ctrd.CRI_TIMEOUT,
        )
        return list(done.containers)

    def container_env(self, container_id: str) -> dict[str, str]:
        """The process environment containerd gave a container (from its OCI spec)."""
        done: cri.ContainerStatusResponse = self.containerd.runtime.ContainerStatus(
            cri.ContainerStatusRequest(container_id=container_id, verbose=True),
            timeout=ctrd.CRI_TIMEOUT,
        )
        info = json.loads(done.info["info"])
        env: list[str] = info["runtimeSpec"]["process"]["env"]
        return dict(item.split("=", 1) for item in env)

    # -- pods in the API -------------------------------------------------------------

    def pod_manifest(self, name: str, networks: str, limits: dict[str, str] | None = None) -> Json:
        """A pod bound to this node (there is no scheduler) running the local pause image."""
        container: Json = {"name": "app", "image": PAUSE_IMAGE, "imagePullPolicy": "Never"}
        if limits:
            container["resources"] = {"limits": limits, "requests": limits}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "annotations": {NETWORKS: networks}},
            "spec": {
                "nodeName": self.name,
                "containers": [container],
                # No kube-controller-manager publishes kube-root-ca.crt: no token volume.
                "automountServiceAccountToken": False,
                "enableServiceLinks": False,
                "terminationGracePeriodSeconds": 5,
            },
        }

    def get_pod(self, namespace: str, name: str) -> Json | None:
        try:
            pod: Json = self.cluster.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        return pod

    def wait_pod(
        self, namespace: str, name: str, want: Callable[[Json | None], bool], what: str
    ) -> Json | None:
        """Poll the pod until `want(pod)`; on timeout fail with its status and the logs."""
        deadline = time.monotonic() + POD_TIMEOUT
        while True:
            pod = self.get_pod(namespace, name)
            if want(pod):
                return pod
            failed = bool(pod and pod.get("status", {}).get("phase") == "Failed")
            if failed or time.monotonic() > deadline or not self.kubelet.running():
                status = json.dumps((pod or {}).get("status", {}), indent=1)[:3000]
                raise AssertionError(
                    f"pod {namespace}/{name} not {what} (phase Failed: {failed}, kubelet "
                    f"running: {self.kubelet.running()}, limit {POD_TIMEOUT:.0f} s)\n"
                    f"--- pod status\n{status}\n{self.diagnostics()}"
                )
            time.sleep(0.2)

    def run_pod(self, namespace: str, manifest: Json) -> Json:
        """Create the pod in the API and wait until it is Running; return it."""
        self.cluster.create(f"/api/v1/namespaces/{namespace}/pods", manifest)
        return self.wait_running(namespace, manifest["metadata"]["name"])

    def wait_running(self, namespace: str, name: str) -> Json:
        """Wait until the pod is Running on this node; return it."""
        pod = self.wait_pod(
            namespace,
            name,
            lambda p: bool(p and p.get("status", {}).get("phase") == "Running"),
            "Running",
        )
        assert pod is not None
        return pod

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete gracefully, as a user would, and wait until the kubelet has let it go."""
        self.cluster.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
        self.wait_pod(namespace, name, lambda p: p is None, "gone from the API")

    def libcni_result(self, sandbox_id: str) -> Path:
        """containerd's libcni cache of the sandbox's ADD (our generated network, eth0)."""
        return self.var_lib_cni / "results" / f"{NETWORK_NAME}-{sandbox_id}-eth0"

    def record(self, container_id: str) -> Json:
        """Plexus's attachment record of a sandbox (meta/records.py)."""
        record: Json = json.loads((self.cni_state / "records" / container_id).read_text())
        return record

    def records(self) -> set[str]:
        path = self.cni_state / "records"
        return {p.name for p in path.iterdir()} if path.is_dir() else set()

    # -- teardown --------------------------------------------------------------------

    def delete_node_pods(self) -> None:
        """Force-delete (grace 0) every pod bound to this node, in every namespace."""
        with contextlib.suppress(ApiError, OSError):
            pods = self.cluster.get(
                "/api/v1/pods", query={"fieldSelector": f"spec.nodeName={self.name}"}
            )["items"]
            for pod in pods:
                meta = pod["metadata"]
                with contextlib.suppress(ApiError):
                    self.cluster.request(
                        "DELETE",
                        f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                        {"gracePeriodSeconds": 0},
                    )

    def _remove_sandbox(self, sandbox_id: str) -> None:
        with contextlib.suppress(grpc.RpcError):
            self.containerd.remove_pod(sandbox_id)

    def _remove_sandboxes(self) -> None:
        """Remove every sandbox of our containerd (RemovePodSandbox stops a running one
        first), in parallel: a DEL for a pod already gone from the API costs the daemon ~3 s
        each. Then the runtime tier's sequential Stop + Remove, for anything left."""
        if self.containerd.proc is None:
            return
        ids = [sandbox.id for sandbox in self.sandboxes()]
        for sandbox_id in ids:
            with contextlib.suppress(grpc.RpcError, AssertionError):  # hostNetwork: no netns
                self.sandbox_netns(sandbox_id)
        with ThreadPoolExecutor(max(1, len(ids))) as pool:
            list(pool.map(self._remove_sandbox, ids))
        self.containerd.teardown_all()

    def _remove_host_state(self) -> None:
        """Sandbox netns (on the host's /run/netns), mounts and cgroups containerd may have
        left. (Its libcni results are in the node's own /var/lib/cni, under the temp dir.)"""
        for path in self._sandbox_netns:
            if Path(path).exists():
                subprocess.run(["umount", path], capture_output=True, check=False)
                with contextlib.suppress(OSError):
                    Path(path).unlink()
        ctrd.unmount_under(self.root)
        ctrd.remove_cgroups(self.kubelet.cgroup_root)

    def _remove_api_objects(self) -> None:
        for api_path in (
            f"/api/v1/nodes/{self.name}",
            f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{self.name}",
        ):
            with contextlib.suppress(ApiError, OSError):
                self.cluster.request("DELETE", api_path)

    def _remove_dirs(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def close(self) -> None:
        """Undo everything start() did, whatever state it reached."""
        run_all(
            [
                self.delete_node_pods,
                self.kubelet.stop,
                self._remove_sandboxes,
                self.containerd.stop,
                lambda: self.daemon.stop() if self.daemon is not None else None,
                lambda: self.forward.stop() if self.forward is not None else None,
                self._remove_host_state,
                self.mounts.close,
                self._remove_api_objects,
                self.node.close,
                self._remove_dirs,
            ]
        )


def create_nad(
    cluster: Cluster, namespace: str, name: str, config: dict[str, Any], resource: str = ""
) -> None:
    metadata: dict[str, Any] = {"name": name}
    if resource:
        metadata["annotations"] = {RESOURCE_ANNOTATION: resource}
    cluster.create(
        f"/apis/k8s.cni.cncf.io/v1/namespaces/{namespace}/network-attachment-definitions",
        {
            "apiVersion": "k8s.cni.cncf.io/v1",
            "kind": "NetworkAttachmentDefinition",
            "metadata": metadata,
            "spec": {"config": json.dumps(config)},
        },
    )


def network_status(kn: KubeletNode, namespace: str, name: str) -> list[dict[str, Any]]:
    """The pod's network-status annotation, once Plexus has written it."""
    pod = kn.wait_pod(
        namespace,
        name,
        lambda p: STATUS in ((p or {}).get("metadata", {}).get("annotations") or {}),
        "annotated with network-status",
    )
    assert pod is not None
    return list(json.loads(pod["metadata"]["annotations"][STATUS]))


class DevicePlugin:
    """`plexus deviceplugin` as a process in the node namespace, registering with the
    node's kubelet, on a FAKE sysfs tree (tests/unit/deviceplugin/fake_sysfs.py) whose PF
    netdev is a symlink to the node's real veth `uplink0` (`ip netns exec` remounts /sys
    for the namespace), as tests/netns/test_deviceplugin.py does. Stopped by PID."""

    def __init__(
        self,
        kn: KubeletNode,
        resource_name: str,
        pf: str,
        vfs: list[str],
        registration: str = "kubelet",
        extra_args: Sequence[str] = (),
    ) -> None:
        self.kn = kn
        self.registration = registration
        self.extra_args = list(extra_args)
        self.dir = kn.root / f"deviceplugin-{resource_name}"
        self.dir.mkdir()
        self.config = self.dir / "config.json"
        self.config.write_text(
            json.dumps(
                {
                    "resourceList": [
                        {"resourceName": resource_name, "selectors": {"pfNames": [kn.node.uplink]}}
                    ]
                }
            )
        )
        self.sysfs = FakeSysfs(self.dir / "sys")
        self.sysfs.add_pf(pf, kn.node.uplink, real_netdev=True)
        for index, address in enumerate(vfs):
            self.sysfs.add_vf(pf, index, address, netdev=f"{kn.node.uplink}v{index}")
        self.log = self.dir / "deviceplugin.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                ["ip", "netns", "exec", self.kn.node.name, PLEXUS, "deviceplugin",
                 "--config", str(self.config),
                 "--sysfs-root", str(self.sysfs.root),
                 "--plugins-dir", str(self.kn.kubelet.device_plugins_dir),
                 "--registry-dir", str(self.kn.kubelet.plugins_registry_dir),
                 "--registration", self.registration,
                 "--devinfo-dir", str(self.kn.devinfo_dir), *self.extra_args],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )  # fmt: skip

    def registrations(self) -> int:
        """How many times it has registered with a kubelet, from its own log."""
        return tail(self.log, 10_000).count("registered with the kubelet")

    def stop(self) -> int | None:
        """SIGTERM by PID; its exit code (None if it was not running)."""
        if self.proc is None:
            return None
        code = self.proc.poll()
        if code is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                code = self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                code = self.proc.wait(timeout=15)
        self.proc = None
        return code

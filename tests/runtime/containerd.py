"""A private containerd for the runtime tier, started and stopped by PID, talking CRI.

Two releases run here (`Release`): containerd 2.x built from Go modules by
scripts/build-go-tools.sh (its own shim and ctr, a version 3 config), which the tiers run
by default, and Debian's 1.6 (a version 2 config), which one node of the two-node tier and
a smoke test still run. Both use Debian's runc.

The daemon runs inside the test node's network namespace (`nsenter --net`, so it shares
the host's mount namespace): the CNI plugins it execs, the bridge and the macvlan master
then all live in a namespace the tests own, never on the host's network. Its root,
state, gRPC and ttrpc sockets and log are under one temp dir; the CRI plugin execs CNI
plugins from one `bin_dir` and reads one network config from `conf_dir`. Sandbox netns
stay in /run/netns (`cni-*`): that mount is shared, so they also appear in the mount
namespace of a `plexus daemon` started with `ip netns exec` (a state-dir mount would
not, / being private here).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cri_api.v1 import api_pb2 as cri
from cri_api.v1 import api_pb2_grpc as cri_grpc

from tests.runtime.image import NAME as PAUSE_IMAGE

GO_TOOLS = Path(os.environ.get("PLEXUS_GO_TOOLS", "/var/cache/plexus-go-tools")) / "bin"
RUNC = shutil.which("runc") or "/usr/sbin/runc"
NAMESPACE = "k8s.io"  # the containerd namespace the CRI plugin works in
CRI_TIMEOUT = 60.0
# Plexus's image (a 430 MB archive) imports in ~30 s when the machine is idle, in over
# 60 s under load from other work.
IMPORT_TIMEOUT = 300.0


@dataclass(frozen=True)
class Release:
    """One containerd release: its binaries and the config format it reads."""

    name: str
    containerd: Path
    ctr: Path
    shim: Path | None  # the runc shim; None: containerd finds its own on PATH
    config_version: int

    def missing(self) -> list[str]:
        """Its binaries (and runc) that are not installed or built."""
        paths = [self.containerd, self.ctr, Path(RUNC)] + ([self.shim] if self.shim else [])
        return [str(p) for p in paths if not os.access(p, os.X_OK)]


DEBIAN = Release(
    "containerd 1.6 (Debian)",
    Path(shutil.which("containerd") or "/usr/bin/containerd"),
    Path(shutil.which("ctr") or "/usr/bin/ctr"),
    None,
    2,
)
BUILT = Release(
    "containerd 2.x (built)",
    GO_TOOLS / "containerd",
    GO_TOOLS / "ctr",
    GO_TOOLS / "containerd-shim-runc-v2",
    3,
)


def missing(release: Release = BUILT) -> list[str]:
    """The binaries this tier needs for `release` that are absent."""
    return release.missing()


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


class Containerd:
    """One containerd process with the CRI plugin, in the node namespace `netns`."""

    def __init__(
        self,
        workdir: Path,
        netns: str,
        bin_dir: Path,
        conf_dir: Path,
        cgroup_parent: str,
        enter: Sequence[str] = ("nsenter",),
        release: Release = BUILT,
        cdi_dirs: Sequence[Path] = (),
    ) -> None:
        self.release = release
        self.cdi_dirs = list(cdi_dirs)  # where 2.x resolves CDI devices (1.6: CDI off)
        self.dir = workdir
        self.enter = list(enter)  # nsenter with any namespace besides the node netns
        self.cgroup_parent = cgroup_parent
        self.netns = netns
        self.bin_dir = bin_dir
        self.conf_dir = conf_dir
        self.root = workdir / "root"
        self.state = workdir / "state"
        self.socket = workdir / "containerd.sock"
        self.config = workdir / "config.toml"
        self.log = workdir / "containerd.log"
        self.proc: subprocess.Popen[bytes] | None = None
        # Names in /run/netns of this containerd's sandboxes, as seen: that dir is the
        # host's, shared with every other runtime on the machine.
        self.netns_seen: set[str] = set()
        self._channel: grpc.Channel | None = None
        self._stub: cri_grpc.RuntimeServiceStub | None = None

    # -- process ----------------------------------------------------------------

    def write_config(self) -> None:
        common = f"""root = {_toml(str(self.root))}
state = {_toml(str(self.state))}

[grpc]
  address = {_toml(str(self.socket))}

[ttrpc]
  address = {_toml(str(self.socket) + ".ttrpc")}

[debug]
  address = ""

[metrics]
  address = ""
"""
        writer = self._config_v3 if self.release.config_version == 3 else self._config_v2
        self.config.write_text(writer(common))

    def _config_v2(self, common: str) -> str:
        """containerd 1.6's format."""
        cri_plugin = 'plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
{common}
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
]

[{cri_plugin}]
  sandbox_image = {_toml(PAUSE_IMAGE)}
  # The VM lacks CAP_SYS_RESOURCE: without this runc fails on oom_score_adj.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_cdi = false

[{cri_plugin}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri_plugin}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri_plugin}.containerd.runtimes.runc.options]
  BinaryName = {_toml(RUNC)}

[{cri_plugin}.cni]
  bin_dir = {_toml(str(self.bin_dir))}
  conf_dir = {_toml(str(self.conf_dir))}
  max_conf_num = 1
"""

    def _config_v3(self, common: str) -> str:
        """containerd 2.x's format: the CRI plugin split into images, runtime and the
        gRPC service. NRI is off (it would make its socket under the host's /var/run)."""
        runtime = "plugins.'io.containerd.cri.v1.runtime'"
        images = "plugins.'io.containerd.cri.v1.images'"
        assert self.release.shim is not None
        return f"""version = 3
{common}
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.erofs",
  "io.containerd.snapshotter.v1.blockfile", "io.containerd.nri.v1.nri",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
]

[{images}]
  snapshotter = "overlayfs"

[{images}.pinned_images]
  sandbox = {_toml(PAUSE_IMAGE)}

[{runtime}]
  # The VM lacks CAP_SYS_RESOURCE: without this runc fails on oom_score_adj.
  restrict_oom_score_adj = true
  # CDI is always on in 2.x: only the dirs given, never the host's /etc/cdi.
  cdi_spec_dirs = [{", ".join(_toml(str(d)) for d in self.cdi_dirs)}]

[{runtime}.containerd]
  default_runtime_name = "runc"

[{runtime}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
  runtime_path = {_toml(str(self.release.shim))}

[{runtime}.containerd.runtimes.runc.options]
  BinaryName = {_toml(RUNC)}

[{runtime}.cni]
  bin_dirs = [{_toml(str(self.bin_dir))}]
  conf_dir = {_toml(str(self.conf_dir))}
  max_conf_num = 1

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""

    def start(self) -> None:
        self.write_config()
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    *self.enter,
                    f"--net=/run/netns/{self.netns}",
                    str(self.release.containerd),
                    "--config",
                    str(self.config),
                    "--log-level",
                    "info",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while True:
            assert self.proc.poll() is None, f"containerd exited at start-up:\n{self.log_tail()}"
            if self.socket.exists() and self.ready():
                break
            assert time.monotonic() < deadline, f"containerd not ready in 30 s:\n{self.log_tail()}"
            time.sleep(0.05)

    def ready(self) -> bool:
        """CRI answers and reports RuntimeReady and NetworkReady (our conflist is loaded)."""
        try:
            done: cri.StatusResponse = self.runtime.Status(cri.StatusRequest(), timeout=2)
        except grpc.RpcError:
            return False
        conditions = {c.type: c.status for c in done.status.conditions}
        return conditions.get("RuntimeReady", False) and conditions.get("NetworkReady", False)

    def import_image(self, tarball: Path) -> None:
        done = subprocess.run(
            [
                str(self.release.ctr),
                "--address",
                str(self.socket),
                "--namespace",
                NAMESPACE,
                "images",
                "import",
                str(tarball),
            ],
            capture_output=True,
            text=True,
            timeout=IMPORT_TIMEOUT,
        )
        assert done.returncode == 0, f"ctr images import failed: {done.stdout} {done.stderr}"
        deadline = time.monotonic() + 30
        while not self.image_known(PAUSE_IMAGE):  # CRI learns images from containerd's events
            assert time.monotonic() < deadline, f"CRI never saw {PAUSE_IMAGE}"
            time.sleep(0.05)

    def image_known(self, ref: str) -> bool:
        images = cri_grpc.ImageServiceStub(self.channel)  # type: ignore[no-untyped-call]
        status: cri.ImageStatusResponse = images.ImageStatus(
            cri.ImageStatusRequest(image=cri.ImageSpec(image=ref)), timeout=CRI_TIMEOUT
        )
        return bool(status.image.id)

    def stop(self) -> None:
        """SIGTERM containerd by PID (SIGKILL after 20 s); then end any shim it left."""
        if self._channel is not None:
            self._channel.close()
            self._channel = None
            self._stub = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        self.proc = None
        for pid in self.leftover_processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def leftover_processes(self) -> list[int]:
        """PIDs of shims started by this containerd (their command line names our socket)
        and of their children (the pause processes)."""
        shims = [pid for pid, cmd in _processes() if str(self.socket).encode() in cmd]
        children = [pid for pid, _ in _processes() if _ppid(pid) in shims]
        return children + shims

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    # -- CRI ----------------------------------------------------------------------

    @property
    def channel(self) -> grpc.Channel:
        if self._channel is None:
            self._channel = grpc.insecure_channel(f"unix://{self.socket}")
        return self._channel

    @property
    def runtime(self) -> cri_grpc.RuntimeServiceStub:
        if self._stub is None:
            self._stub = cri_grpc.RuntimeServiceStub(self.channel)  # type: ignore[no-untyped-call]
        return self._stub

    def run_pod(
        self, name: str, namespace: str = "default", uid: str = ""
    ) -> cri.RunPodSandboxResponse:
        """RunPodSandbox as a kubelet would; raises grpc.RpcError on failure."""
        config = cri.PodSandboxConfig(
            metadata=cri.PodSandboxMetadata(
                name=name, namespace=namespace, uid=uid or f"uid-{name}", attempt=0
            ),
            hostname=name,
            log_directory=str(self.dir / "pod-logs" / f"{namespace}_{name}"),
            linux=cri.LinuxPodSandboxConfig(
                cgroup_parent=self.cgroup_parent,
                security_context=cri.LinuxSandboxSecurityContext(
                    namespace_options=cri.NamespaceOption(network=cri.NamespaceMode.POD)
                ),
            ),
        )
        response: cri.RunPodSandboxResponse = self.runtime.RunPodSandbox(
            cri.RunPodSandboxRequest(config=config), timeout=CRI_TIMEOUT
        )
        return response

    def status(self, sandbox_id: str) -> tuple[cri.PodSandboxStatus, dict[str, Any]]:
        """The sandbox's CRI status and containerd's verbose info."""
        done: cri.PodSandboxStatusResponse = self.runtime.PodSandboxStatus(
            cri.PodSandboxStatusRequest(pod_sandbox_id=sandbox_id, verbose=True),
            timeout=CRI_TIMEOUT,
        )
        info: dict[str, Any] = json.loads(done.info.get("info", "{}"))
        return done.status, info

    def netns_path(self, sandbox_id: str) -> str:
        """The sandbox's network namespace path, from the OCI spec containerd reports."""
        _, info = self.status(sandbox_id)
        for ns in info["runtimeSpec"]["linux"]["namespaces"]:
            if ns["type"] == "network":
                self.netns_seen.add(Path(ns["path"]).name)
                return str(ns["path"])
        raise AssertionError(f"sandbox {sandbox_id} has no network namespace")

    def stop_pod(self, sandbox_id: str) -> None:
        self.runtime.StopPodSandbox(
            cri.StopPodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=CRI_TIMEOUT
        )

    def remove_pod(self, sandbox_id: str) -> None:
        self.runtime.RemovePodSandbox(
            cri.RemovePodSandboxRequest(pod_sandbox_id=sandbox_id), timeout=CRI_TIMEOUT
        )

    def cni_networks(self) -> list[dict[str, Any]]:
        """The CNI networks the CRI plugin has loaded now, loopback aside (each its
        `Config`: Name, CNIVersion, Source, Plugins)."""
        done: cri.StatusResponse = self.runtime.Status(
            cri.StatusRequest(verbose=True), timeout=CRI_TIMEOUT
        )
        loaded = json.loads(done.info.get("cniconfig", "{}")).get("Networks") or []
        return [net["Config"] for net in loaded if net["Config"]["Name"] != "cni-loopback"]

    def cni_network(self, name: str) -> dict[str, Any]:
        """CNI network `name` as the CRI plugin loaded it; {} while it has none so named."""
        return next((net for net in self.cni_networks() if net["Name"] == name), {})

    def sandboxes(self) -> list[str]:
        done: cri.ListPodSandboxResponse = self.runtime.ListPodSandbox(
            cri.ListPodSandboxRequest(), timeout=CRI_TIMEOUT
        )
        return [item.id for item in done.items]

    def teardown_all(self) -> list[str]:
        """Stop and remove every sandbox; return the errors (teardown goes on past them)."""
        errors = []
        for sandbox_id in self.sandboxes():
            for step in (self.stop_pod, self.remove_pod):
                try:
                    step(sandbox_id)
                except grpc.RpcError as err:
                    errors.append(f"{step.__name__} {sandbox_id}: {err}")
        return errors


def _processes() -> Iterator[tuple[int, bytes]]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                yield int(entry.name), (entry / "cmdline").read_bytes()
            except OSError:
                continue


def _ppid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return -1
    return int(stat.rsplit(")", 1)[1].split()[1])


def remove_empty_tree(path: Path) -> None:
    """Remove `path` and the directories below it, if none holds anything else."""
    if not path.is_dir():
        return
    for sub in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(OSError):
        path.rmdir()


def remove_cgroups(parent: str) -> None:
    """Remove `parent` and the cgroups below it from every cgroup hierarchy (they are empty
    once their containers are gone)."""
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        remove_empty_tree(hierarchy / parent.strip("/"))


def unmount_under(directory: Path) -> None:
    """Lazily unmount every mount point at or below `directory`, deepest first."""
    prefix = str(directory.resolve())
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            points.append(point)
    for point in sorted(set(points), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)

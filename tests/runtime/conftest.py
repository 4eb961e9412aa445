"""Fixtures for the runtime tier: a real containerd calling Plexus through CRI, as a kubelet would.

One containerd 2.x for the whole tier (tests/runtime/containerd.py; `runtime`), and
Debian's containerd 1.6 for the smoke test that still runs on it (`runtime_debian`), each
in a throwaway "node" namespace (tests/netns/conftest.py's Node: the bridge, the macvlan
master `uplink0` and the embedded cluster store live there). Its CNI `conf_dir` holds one
conflist whose only plugin is Plexus (`{"type": "plexus", ...}` with `clusterDir`), at
cniVersion 1.1.0 on 2.x (so containerd calls STATUS) and 1.0.0 on 1.6, so pods and NADs
come from YAML files and no Kubernetes is needed; `bin_dir` holds the reference plugins
from /usr/lib/cni plus Plexus's installed shim and Python binaries. The sandbox image is
built locally (tests/runtime/image.py). Tests ask for `daemon` to have the shim forward
to `plexus daemon`; without it the shim falls back to `plexus-thin`.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.netns.conftest import Node
from tests.netns.daemon import Daemon
from tests.runtime import containerd as ctrd
from tests.runtime.image import build_pause_image, compiler

NETNS_DIR = Path("/run/netns")
LIBCNI_CACHE = Path("/var/lib/cni")  # containerd's libcni keeps its result cache here
# Directories containerd or libcni create outside our temp dir; removed if they were
# absent before the session and are empty after it.
_HOST_DIRS = (Path("/run/containerd"), LIBCNI_CACHE)


@dataclass
class Runtime:
    """The tier's node, its containerd, and the name of the CNI network containerd uses."""

    node: Node
    containerd: ctrd.Containerd
    network: str

    def netns_names(self) -> set[str]:
        """Our sandboxes' netns (as seen through CRI) that still exist."""
        return {name for name in self.containerd.netns_seen if (NETNS_DIR / name).exists()}

    def libcni_results(self) -> set[str]:
        results = LIBCNI_CACHE / "results"
        return {p.name for p in results.glob(f"{self.network}-*")} if results.is_dir() else set()

    def records(self) -> set[str]:
        path = self.node.cni_dir / "records"
        return {p.name for p in path.iterdir()} if path.is_dir() else set()

    def plexus_results(self) -> set[str]:
        path = self.node.cni_dir / "results"
        return {p.name for p in path.iterdir()} if path.is_dir() else set()

    def node_links(self) -> list[str]:
        return self.node.links(f"/run/netns/{self.node.name}")

    def snapshot(self) -> dict[str, Any]:
        """Everything a sandbox leaves behind while it lives: compare before and after."""
        return {
            "node links": self.node_links(),
            "host-local IPs": self.node.reserved_ips(),
            "plexus records": sorted(self.records()),
            "plexus results": sorted(self.plexus_results()),
            "sandbox netns": sorted(self.netns_names()),
            "libcni results": sorted(self.libcni_results()),
            "sandboxes": sorted(self.containerd.sandboxes()),
        }


# The conflist's cniVersion per config format: containerd 2.x's libcni (1.3) reads 1.1.0
# and then calls STATUS; 1.6's libcni (1.1) cannot parse a 1.1.0 result.
_CNI_VERSION = {3: "1.1.0", 2: "1.0.0"}


@pytest.fixture(scope="package")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    """A running containerd 2.x with Plexus as its only CNI network; everything undone after."""
    with running_runtime(tmp_path_factory.mktemp("runtime"), ctrd.BUILT) as rt:
        yield rt


@pytest.fixture(scope="module")
def runtime_debian(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    """The same on Debian's containerd 1.6."""
    with running_runtime(tmp_path_factory.mktemp("runtime-debian"), ctrd.DEBIAN) as rt:
        yield rt


@contextmanager
def running_runtime(root: Path, release: ctrd.Release) -> Iterator[Runtime]:
    """containerd of `release` in a fresh node namespace, Plexus its CNI network."""
    missing = release.missing()
    if missing:
        pytest.skip(
            f"{release.name} is not installed ({', '.join(missing)} absent): run make setup"
        )
    assert compiler() is not None, "no C compiler for the pause image (run make setup)"
    absent = [path for path in _HOST_DIRS if not path.exists()]
    (root / "node").mkdir()
    node = Node(root / "node")
    network = f"plexus-rt-{node.tag}"
    conf_dir = root / "net.d"
    conf_dir.mkdir()
    (conf_dir / "10-plexus.conflist").write_text(
        json.dumps(
            {
                "cniVersion": _CNI_VERSION[release.config_version],
                "name": network,
                "plugins": [node.meta()],
            }
        )
    )
    (root / "containerd").mkdir()
    cd = ctrd.Containerd(
        root / "containerd",
        node.name,
        node.bin,
        conf_dir,
        cgroup_parent=f"/{network}",
        release=release,
    )
    rt = Runtime(node=node, containerd=cd, network=network)
    try:
        cd.start()
        cd.import_image(build_pause_image(root))
        yield rt
    finally:
        try:
            if cd.proc is not None:
                for sandbox_id in cd.sandboxes():  # their netns, should teardown leave one
                    with contextlib.suppress(grpc.RpcError, KeyError, AssertionError):
                        cd.netns_path(sandbox_id)
                cd.teardown_all()
        finally:
            cd.stop()
            # What containerd may have left: sandbox netns, libcni results, mounts, cgroups.
            for name in rt.netns_names():
                subprocess.run(["umount", str(NETNS_DIR / name)], capture_output=True, check=False)
                with contextlib.suppress(OSError):
                    (NETNS_DIR / name).unlink()
            for name in rt.libcni_results():
                with contextlib.suppress(OSError):
                    (LIBCNI_CACHE / "results" / name).unlink()
            ctrd.unmount_under(root)
            ctrd.remove_cgroups(f"/{network}")
            for path in absent:
                ctrd.remove_empty_tree(path)
            node.close()
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def daemon(runtime: Runtime) -> Iterator[Daemon]:
    """`plexus daemon` in the node namespace, so the shim forwards every call to it."""
    d = Daemon(runtime.node)
    d.start()
    try:
        yield d
    finally:
        d.stop()


@dataclass
class Pods:
    """Pods of one test: their manifests in the store and their sandboxes, undone after."""

    rt: Runtime
    sandboxes: dict[str, str] = field(default_factory=dict)  # pod name -> sandbox ID

    def create(self, name: str, networks: str | None = None) -> None:
        self.rt.node.pod(name, networks)

    def run(self, name: str) -> str:
        sandbox_id = self.rt.containerd.run_pod(name).pod_sandbox_id
        self.sandboxes[name] = sandbox_id
        return sandbox_id

    def stop_and_remove(self, name: str) -> None:
        sandbox_id = self.sandboxes.pop(name)
        self.rt.containerd.stop_pod(sandbox_id)
        self.rt.containerd.remove_pod(sandbox_id)

    def close(self) -> None:
        for sandbox_id in self.sandboxes.values():
            for step in (self.rt.containerd.stop_pod, self.rt.containerd.remove_pod):
                with contextlib.suppress(grpc.RpcError):
                    step(sandbox_id)
        self.sandboxes.clear()


@pytest.fixture
def pods(request: pytest.FixtureRequest, runtime: Runtime) -> Iterator[Pods]:
    p = Pods(runtime)
    try:
        yield p
    finally:
        p.close()
        report = request.node.stash.get(_CALL_REPORT, None)
        if report is not None and report.failed:  # shown under "Captured stdout teardown"
            print(f"--- containerd log (tail)\n{runtime.containerd.log_tail()}")
            print(f"--- plexus log (tail)\n{_tail(runtime.node.root / 'plexus.log')}")


_CALL_REPORT = pytest.StashKey[pytest.TestReport]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report: pytest.TestReport = yield
    if report.when == "call":
        item.stash[_CALL_REPORT] = report
    return report


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def in_netns(path: str, *cmd: str) -> str:
    """Run `cmd` in the network namespace at `path` (a sandbox's netns is not in /run/netns
    under a name we chose, so nsenter rather than `ip netns exec`)."""
    done = subprocess.run(
        ["nsenter", f"--net={path}", *cmd], capture_output=True, text=True, check=True
    )
    return done.stdout


def addresses(netns_path: str) -> dict[str, dict[str, Any]]:
    """Links of a netns: name -> {"mac": ..., "ips": [global addresses]}."""
    links = json.loads(in_netns(netns_path, "ip", "-j", "addr", "show"))
    return {
        link["ifname"]: {
            "mac": link.get("address", ""),
            "ips": [a["local"] for a in link["addr_info"] if a.get("scope") == "global"],
        }
        for link in links
    }

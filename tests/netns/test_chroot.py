"""`chrootDir`: exec'd delegates run against the host's filesystem, not the daemon's.

The "host" is a real chroot dir: this machine's /usr bound read-only (the reference
plugins are dynamically linked), its own /etc, CNI bin dir and /var/lib/cni. Files there
exist only for a process chrooted into it, as the host's files do for a daemon whose
container has the host's / at /hostroot.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni import callscope
from cni.env import cni_env
from cni.errors import CNIError
from cni.invoke import ExecExecutor
from meta.install import SHIM_NAME, install_binaries
from tests.netns.conftest import REFERENCE, Node


class HostRoot:
    """A chroot dir standing in for the host's / (mounts undone by close())."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.bin = f"/plexus-test-bin-{uuid.uuid4().hex[:6]}"  # exists only in here
        self.mounts: list[Path] = []
        for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64")):
            (path / link).symlink_to(target)
        self._bind("/usr", path / "usr", readonly=True)
        self._bind("/proc", path / "proc", readonly=False)  # bridge writes sysctls
        (path / "etc").mkdir()
        self.leases = path / "var/lib/cni/networks"
        self.leases.mkdir(parents=True)
        (path / self.bin.lstrip("/")).mkdir()
        for plugin in ("bridge", "host-local", "loopback"):
            shutil.copy(REFERENCE / plugin, path / self.bin.lstrip("/") / plugin)

    def install_shim(self, scratch: Path) -> Path:
        """Put the Plexus shim into the root's bin dir (it execs and chroots delegates)."""
        install_binaries(scratch, shim_only=True, prebuilt=scratch / "none")
        return Path(shutil.copy(scratch / SHIM_NAME, self.path / self.bin.lstrip("/")))

    def _bind(self, source: str, target: Path, readonly: bool) -> None:
        if not target.exists():
            target.mkdir(parents=True)
        subprocess.run(["mount", "--bind", source, str(target)], check=True)
        self.mounts.append(target)
        if readonly:
            subprocess.run(["mount", "-o", "remount,bind,ro", str(target)], check=True)

    def share_netns(self, netns: str) -> None:
        """Make a pod's netns path valid inside the root too (on a host it is the same)."""
        inside = self.path / netns.lstrip("/")
        inside.parent.mkdir(parents=True, exist_ok=True)
        inside.touch()
        self._bind(netns, inside, readonly=False)

    def close(self) -> bool:
        """Undo the mounts; False if one is still there (then nothing may be deleted)."""
        clean = True
        for target in reversed(self.mounts):
            if subprocess.run(["umount", str(target)], capture_output=True).returncode != 0:
                clean = False
        return clean


@pytest.fixture
def hostroot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostRoot]:
    path = tmp_path_factory.mktemp("hostroot")
    root = HostRoot(path)
    try:
        yield root
    finally:
        if root.close():
            shutil.rmtree(path, ignore_errors=True)


def _host_local(network: str, resolv: str) -> dict[str, object]:
    return {
        "cniVersion": "1.0.0",
        "name": network,
        "ipam": {
            "type": "host-local",
            "resolvConf": resolv,  # default dataDir: /var/lib/cni/networks, the host's
            "ranges": [[{"subnet": "10.77.0.0/24"}]],
        },
    }


@pytest.mark.parametrize("via", ["chroot(8)", "shim"])
def test_exec_runs_the_plugin_chrooted_with_host_files_and_state(
    hostroot: HostRoot, via: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chrooted by chroot(8), or by the shim when there is one (then chroot(8) is not
    exec'd: made missing here)."""
    with callscope.call_scope() as scope:
        if via == "shim":
            scope.wrapper = str(hostroot.install_shim(tmp_path))
            monkeypatch.setattr(shutil, "which", lambda name: f"/nonexistent/{name}")
        _chrooted_host_local(hostroot)


def _chrooted_host_local(hostroot: HostRoot) -> None:
    network = f"pxt-chroot-{uuid.uuid4().hex[:6]}"
    (hostroot.path / "etc/plexus-test-resolv.conf").write_text("nameserver 10.77.0.53\n")
    # The "host" itself holds .2: the plugin in the chroot must see it and skip it.
    (hostroot.leases / network).mkdir()
    (hostroot.leases / network / "10.77.0.2").write_text("host\neth0")
    conf = json.dumps(_host_local(network, "/etc/plexus-test-resolv.conf")).encode()
    env = cni_env("ADD", "c-chroot", "/run/netns/unused", "eth0", (), [hostroot.bin])
    executor = ExecExecutor(chroot_dir=str(hostroot.path))

    result = json.loads(executor.run("host-local", conf, env))

    assert result["dns"]["nameservers"] == ["10.77.0.53"]  # a file only the host has
    assert [ip["address"] for ip in result["ips"]] == ["10.77.0.3/24"]
    assert (hostroot.leases / network / "10.77.0.3").read_text().startswith("c-chroot")
    assert not Path("/var/lib/cni/networks", network).exists()  # nothing outside the root
    executor.run("host-local", conf, cni_env("DEL", "c-chroot", "", "eth0", (), [hostroot.bin]))
    assert _leases(hostroot.leases / network) == ["10.77.0.2"]

    with pytest.raises(CNIError, match="failed to find plugin"):
        ExecExecutor().run("host-local", conf, env)  # not chrooted: no such CNI_PATH here


_forked_children: list[Path] = []  # where an after-fork hook marks a child, while set


def _mark_child() -> None:
    for marker in _forked_children:
        marker.touch()


os.register_at_fork(after_in_child=_mark_child)


def test_a_chrooted_exec_runs_no_python_in_the_child(hostroot: HostRoot, tmp_path: Path) -> None:
    """chroot(8) or the shim chroots, not a preexec_fn: that forks without vfork and runs the
    process's after-fork hooks in the child, gRPC's among them, which broke an exec of a
    daemon running gRPC's threads."""
    network = f"pxt-chroot-{uuid.uuid4().hex[:6]}"
    conf = json.dumps(_host_local(network, "")).encode()
    executor = ExecExecutor(chroot_dir=str(hostroot.path))
    marker = tmp_path / "child-ran-python"
    _forked_children.append(marker)
    try:
        executor.run("host-local", conf, cni_env("DEL", "c-fork", "", "eth0", (), [hostroot.bin]))
    finally:
        _forked_children.remove(marker)

    assert not marker.exists()


@pytest.mark.parametrize(
    ("secondary_ipam", "shim"), [("exec", False), ("in-process", False), ("exec", True)]
)
def test_chroot_dir_key_runs_every_exec_on_the_host(
    node: Node, hostroot: HostRoot, secondary_ipam: str, shim: bool, tmp_path: Path
) -> None:
    """The secondary's host-local, exec'd (execDelegates) or in-process, keeps its
    leases on the host too: one IPAM state whichever runs it. With the shim in the
    host's bin dir, it execs (and chroots) every plugin, found from outside the root."""
    if shim:
        hostroot.install_shim(tmp_path)
    netns = node.pod_netns()
    hostroot.share_netns(netns)
    network, secondary = f"pxt-chroot-{node.tag}", f"pxt-chroot2-{node.tag}"
    (hostroot.path / "etc/plexus-test-resolv.conf").touch()
    primary = {
        "type": "bridge",
        "bridge": "pxbr0",
        **_host_local(network, "/etc/plexus-test-resolv.conf"),
    }
    # In-process macvlan whose IPAM is exec'd (chrooted) or in-process (under the root).
    macvlan = node.macvlan_conf(name=secondary)
    macvlan["ipam"] = {"type": "host-local", "ranges": [[{"subnet": "10.78.0.0/24"}]]}
    conf = node.meta(
        chrootDir=str(hostroot.path),
        delegates=[primary, macvlan],
        binDir=hostroot.bin,
        execDelegates=["host-local"] if secondary_ipam == "exec" else [],
    )
    del conf["clusterDir"]  # no cluster source: the delegates are the networks

    result = node.ok("ADD", netns=netns, cid="c-chroot", conf=conf)

    # bridge and host-local exist only in the root's bin dir; the leases are the host's
    assert result is not None and result["ips"][0]["address"] == "10.77.0.2/24"
    assert node.links(netns) == ["eth0", "lo", "net1"]
    assert node.addresses(netns, "net1") == ["10.78.0.2"]
    assert _leases(hostroot.leases / network) == ["10.77.0.2"]
    assert _leases(hostroot.leases / secondary) == ["10.78.0.2"]
    assert not Path("/var/lib/cni/networks", secondary).exists()
    node.ok("DEL", netns=netns, cid="c-chroot", conf=conf)
    node.added.clear()
    assert _leases(hostroot.leases / network) == _leases(hostroot.leases / secondary) == []


def _leases(network_dir: Path) -> list[str]:
    return sorted(p.name for p in network_dir.iterdir() if p.name[0].isdigit())

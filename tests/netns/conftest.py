"""Fixtures for the real-netns tier: namespaces, reference plugins, the installed binary.

Every test gets a private "node" namespace (where the bridge and the macvlan
uplink live, and where the plugin runs) and a temp dir for all of Plexus's
state, so tests never touch the host's network or /var/lib/cni.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from cni.fileio import write_atomic
from meta.config import DEFAULT_ALLOWED_HOST_PATHS
from meta.install import install_binaries

REFERENCE = Path("/usr/lib/cni")

if os.geteuid() != 0:
    pytest.skip("the netns tier needs root to create network namespaces", allow_module_level=True)
if not (REFERENCE / "bridge").exists():
    pytest.skip(
        f"reference CNI plugins missing in {REFERENCE} (run make setup)", allow_module_level=True
    )


def sh(*cmd: str, netns: str = "", check: bool = True) -> subprocess.CompletedProcess[str]:
    full = ["ip", "netns", "exec", netns, *cmd] if netns else list(cmd)
    return subprocess.run(full, check=check, capture_output=True, text=True)


def finish(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[str, str]:
    """Its stdout and stderr once it exits; killed if it has not within `timeout`."""
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


class Node:
    """A throwaway node: the netns the plugin runs in, plus pod namespaces."""

    def __init__(self, root: Path) -> None:
        tag = uuid.uuid4().hex[:6]
        self.tag = tag
        self.root = root
        self.name = f"pxt-node-{tag}"
        self.uplink = "uplink0"
        self.pods: list[str] = []
        self.added: list[dict[str, Any]] = []  # ADD calls, undone by close()
        sh("ip", "netns", "add", self.name)
        sh("ip", "link", "set", "lo", "up", netns=self.name)
        sh(
            "ip",
            "link",
            "add",
            self.uplink,
            "type",
            "veth",
            "peer",
            "name",
            "uplink1",
            netns=self.name,
        )
        for link in (self.uplink, "uplink1"):
            sh("ip", "link", "set", link, "up", netns=self.name)
        self.bin = root / "bin"
        self.bin.mkdir()
        for plugin in REFERENCE.iterdir():
            (self.bin / plugin.name).symlink_to(plugin)
        install_binaries(self.bin)
        self.cluster = root / "cluster"
        self.cluster.mkdir()
        self.cni_dir = root / "cni"
        self.ipam = root / "ipam"

    # -- namespaces -------------------------------------------------------------

    def pod_netns(self) -> str:
        name = f"pxt-pod-{self.tag}-{len(self.pods)}"
        sh("ip", "netns", "add", name)
        sh("ip", "link", "set", "lo", "up", netns=name)
        self.pods.append(name)
        return f"/run/netns/{name}"

    def links(self, netns_path: str) -> list[str]:
        out = sh("ip", "-j", "link", "show", netns=os.path.basename(netns_path)).stdout
        return sorted(link["ifname"] for link in json.loads(out))

    def addresses(self, netns_path: str, ifname: str) -> list[str]:
        out = sh(
            "ip", "-j", "addr", "show", "dev", ifname, netns=os.path.basename(netns_path)
        ).stdout
        return [
            a["local"]
            for link in json.loads(out)
            for a in link["addr_info"]
            if a.get("scope") == "global"
        ]

    # -- configs and objects ----------------------------------------------------

    def bridge_conf(self, name: str = "default-net") -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": name,
            "type": "bridge",
            "bridge": "pxbr0",
            "isGateway": True,
            "ipam": {
                "type": "host-local",
                "dataDir": str(self.ipam),
                "ranges": [[{"subnet": "10.99.0.0/16"}]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        }

    def macvlan_conf(self, subnet: str = "10.98.0.0/16", **extra: Any) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "cniVersion": "1.0.0",
            "type": "macvlan",
            "master": self.uplink,
            "mode": "bridge",
            "ipam": {
                "type": "host-local",
                "dataDir": str(self.ipam),
                "ranges": [[{"subnet": subnet, "gateway": str(ipaddress.ip_network(subnet)[1])}]],
            },
        }
        conf.update(extra)
        return conf

    def meta(self, **extra: Any) -> dict[str, Any]:
        conf = {
            "cniVersion": "1.1.0",
            "name": "plexus",
            "type": "plexus",
            "clusterDir": str(self.cluster),
            "cniDir": str(self.cni_dir),
            "socketDir": str(self.root / "run"),
            "logFile": str(self.root / "plexus.log"),
            "logToStderr": False,
            "logLevel": "debug",
            "delegates": [self.bridge_conf()],
            # NADs here keep their IPAM state in the test's dir.
            "allowedHostPaths": [*DEFAULT_ALLOWED_HOST_PATHS, str(self.root)],
        }
        conf.update(extra)
        return conf

    def write(self, filename: str, obj: dict[str, Any]) -> None:
        """Place an object in the store; renamed into place, as a daemon may be reading."""
        text = json.dumps(obj) if filename.endswith(".json") else yaml.safe_dump(obj)
        write_atomic(self.cluster / filename, text.encode(), 0o644)

    def nad(
        self,
        name: str,
        config: dict[str, Any] | str,
        namespace: str = "default",
        annotations: dict[str, str] | None = None,
    ) -> None:
        text = config if isinstance(config, str) else json.dumps(config)
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if annotations:
            meta["annotations"] = annotations
        self.write(
            f"nad-{namespace}-{name}.yaml",
            {
                "apiVersion": "k8s.cni.cncf.io/v1",
                "kind": "NetworkAttachmentDefinition",
                "metadata": meta,
                "spec": {"config": text},
            },
        )

    def pod(
        self,
        name: str,
        networks: str | list[dict[str, Any]] | None = None,
        namespace: str = "default",
        **annotations: str,
    ) -> None:
        notes = dict(annotations)
        if networks is not None:
            notes["k8s.v1.cni.cncf.io/networks"] = (
                networks if isinstance(networks, str) else json.dumps(networks)
            )
        self.write(
            f"pod-{namespace}-{name}.yaml",
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": name,
                    "namespace": namespace,
                    "uid": f"uid-{name}",
                    "annotations": notes,
                },
            },
        )

    def remove(self, filename: str) -> None:
        (self.cluster / filename).unlink()

    def network_status(self, name: str, namespace: str = "default") -> list[dict[str, Any]]:
        obj = yaml.safe_load((self.cluster / f"pod-{namespace}-{name}.yaml").read_text())
        return list(json.loads(obj["metadata"]["annotations"]["k8s.v1.cni.cncf.io/network-status"]))

    def events(self) -> list[dict[str, Any]]:
        path = self.cluster / "events.log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def reserved_ips(self) -> list[str]:
        """IPs host-local holds in any range of this node."""
        found = []
        if self.ipam.exists():
            for path in self.ipam.rglob("*"):
                try:
                    ipaddress.ip_address(path.name)
                except ValueError:
                    continue
                found.append(path.name)
        return sorted(found)

    # -- calls ------------------------------------------------------------------

    def cni(self, verb: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Exec the installed plexus binary as a runtime would, inside the node netns."""
        proc = self.spawn(verb, **kwargs)
        stdout, stderr = finish(proc)
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)

    def spawn(
        self,
        verb: str,
        netns: str = "",
        cid: str = "",
        pod: str = "",
        conf: dict[str, Any] | None = None,
        namespace: str = "default",
        ifname: str = "eth0",
        uid: str = "",
        wrapper: tuple[str, ...] = (),
    ) -> subprocess.Popen[str]:
        """cni() without waiting: the running plexus binary, its stdin already written;
        `wrapper` is a command that execs it (e.g. strace)."""
        args = "IgnoreUnknown=1"
        if pod:
            args += (
                f";K8S_POD_NAMESPACE={namespace};K8S_POD_NAME={pod};"
                f"K8S_POD_INFRA_CONTAINER_ID={cid};K8S_POD_UID={uid or 'uid-' + pod}"
            )
        env = {
            "PATH": os.environ["PATH"],
            "CNI_COMMAND": verb,
            "CNI_CONTAINERID": cid,
            "CNI_NETNS": netns,
            "CNI_IFNAME": ifname,
            "CNI_PATH": str(self.bin),
            "CNI_ARGS": args,
        }
        env = {k: v for k, v in env.items() if v}
        if verb == "ADD":
            self.added.append(
                {
                    "netns": netns,
                    "cid": cid,
                    "pod": pod,
                    "conf": conf,
                    "namespace": namespace,
                    "ifname": ifname,
                }
            )
        with tempfile.TemporaryFile() as stdin:
            stdin.write(json.dumps(conf or self.meta()).encode())
            stdin.seek(0)
            return subprocess.Popen(
                ["ip", "netns", "exec", self.name, *wrapper, str(self.bin / "plexus")],
                stdin=stdin,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                text=True,
            )

    def ok(self, verb: str, **kwargs: Any) -> dict[str, Any] | None:
        done = self.cni(verb, **kwargs)
        assert done.returncode == 0, f"{verb} failed: {done.stdout} {done.stderr}"
        return json.loads(done.stdout) if done.stdout.strip() else None

    def error(self, verb: str, **kwargs: Any) -> dict[str, Any]:
        done = self.cni(verb, **kwargs)
        assert done.returncode != 0, f"{verb} unexpectedly succeeded: {done.stdout}"
        error: dict[str, Any] = json.loads(done.stdout)
        return error

    def close(self) -> None:
        for call in reversed(self.added):
            self.cni("DEL", **call)
        for name in self.pods:
            sh("ip", "netns", "del", name, check=False)
        sh("ip", "netns", "del", self.name, check=False)


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path)
    try:
        yield n
    finally:
        n.close()
        shutil.rmtree(tmp_path, ignore_errors=True)

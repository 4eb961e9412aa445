"""What the ADD benchmarks share: a private node namespace with a veth master, a bin dir
holding the reference plugins and Plexus's, the delegate configs, and timed CNI execs."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

from delegates.netns import run_in_netns
from meta.install import install_binaries

R = TypeVar("R")

REFERENCE = Path("/usr/lib/cni")
GO_TOOLS = Path(os.environ.get("PLEXUS_GO_TOOLS", "/var/cache/plexus-go-tools")) / "bin"


def arguments(doc: str | None) -> argparse.Namespace:
    """`--runs` (rounds per measurement) and `--extras` (secondary macvlan counts)."""
    parser = argparse.ArgumentParser(description=doc)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument(
        "--extras", default="1,2,4,8", type=lambda text: [int(x) for x in text.split(",")]
    )
    return parser.parse_args()


def in_bench(name: str, tools: Collection[str], measure: Callable[[Bench], R]) -> R:
    """`measure` of a fresh Bench, run in its node namespace, the Bench and its files gone
    after; exits naming the Go tools `name` needs when one is missing."""
    missing = [tool for tool in tools if not (GO_TOOLS / tool).exists()]
    if missing:
        sys.exit(f"{name}: run scripts/build-go-tools.sh first (missing {', '.join(missing)})")
    root = Path(tempfile.mkdtemp(prefix=f"plexus-{name}-"))
    bench = Bench(root)
    try:
        return run_in_netns(f"/run/netns/{bench.node}", lambda: measure(bench))
    finally:
        bench.close()
        shutil.rmtree(root, ignore_errors=True)


def sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True)


class Bench:
    """A node namespace, a bin dir and configs shared by all contenders."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.tag = uuid.uuid4().hex[:6]
        self.node = f"pxb-node-{self.tag}"
        sh("ip", "netns", "add", self.node)
        self.ns("ip", "link", "set", "lo", "up")
        self.ns("ip", "link", "add", "up0", "type", "veth", "peer", "name", "up1")
        self.ns("ip", "link", "set", "up0", "up")
        self.ns("ip", "link", "set", "up1", "up")
        self.bin = root / "bin"
        self.bin.mkdir()
        for plugin in REFERENCE.iterdir():
            (self.bin / plugin.name).symlink_to(plugin)
        install_binaries(self.bin)
        if (GO_TOOLS / "multus").exists():
            (self.bin / "multus").symlink_to(GO_TOOLS / "multus")
        self.daemons: list[subprocess.Popen[bytes]] = []
        self.count = 0

    def ns(self, *cmd: str) -> None:
        sh("ip", "netns", "exec", self.node, *cmd)

    def bridge(self) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": "bench-default",
            "type": "bridge",
            "bridge": "pxbbr0",
            "isGateway": True,
            "ipam": {
                "type": "host-local",
                "dataDir": str(self.root / "ipam"),
                "ranges": [[{"subnet": "10.250.0.0/16"}]],
            },
        }

    def macvlan(self, i: int) -> dict[str, Any]:
        return {
            "cniVersion": "1.0.0",
            "name": f"bench-mv{i}",
            "type": "macvlan",
            "master": "up0",
            "mode": "bridge",
            "ipam": {
                "type": "host-local",
                "dataDir": str(self.root / "ipam"),
                "ranges": [[{"subnet": f"10.{200 + i}.0.0/16"}]],
            },
        }

    def meta(self, kind: str, extras: int, **more: Any) -> dict[str, Any]:
        delegates = [self.bridge()] + [self.macvlan(i) for i in range(extras)]
        conf: dict[str, Any] = {
            "cniVersion": "1.0.0",
            "name": "bench",
            "type": kind,
            "delegates": delegates,
            **more,
        }
        if kind == "plexus":
            conf.update(
                cniDir=str(self.root / "plexus"),
                logToStderr=False,
                logFile=str(self.root / "plexus.log"),
                allowedHostPaths=[str(self.root)],  # the NADs' leases are under it
            )
        else:
            conf.update(cniDir=str(self.root / "multus"), logLevel="panic")
        return conf

    def start_daemon(self, extras: int, name: str = "run") -> dict[str, Any]:
        """A daemon serving the meta config with `extras` secondaries, its socket in
        <root>/<name>; the config a call to it must carry (a daemon serves only its own)."""
        conf = self.meta("plexus", extras, socketDir=str(self.root / name), metricsPort=0)
        config = self.root / f"{name}.json"
        config.write_text(json.dumps(conf))
        plexus = Path(sys.executable).parent / "plexus"
        daemon = subprocess.Popen(
            ["ip", "netns", "exec", self.node, str(plexus), "daemon", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.daemons.append(daemon)
        while not (self.root / name / "plexus.sock").exists():
            assert daemon.poll() is None, "daemon failed to start"
            time.sleep(0.05)
        return conf

    def stop_daemons(self) -> None:
        for daemon in self.daemons:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait()
        self.daemons.clear()

    def env(
        self, verb: str, cid: str, netns: str, ifname: str = "eth0", args: str = "IgnoreUnknown=1"
    ) -> dict[str, str]:
        """The CNI environment a runtime sets for one call."""
        return {
            "PATH": os.environ["PATH"],
            "CNI_COMMAND": verb,
            "CNI_CONTAINERID": cid,
            "CNI_NETNS": netns,
            "CNI_IFNAME": ifname,
            "CNI_PATH": str(self.bin),
            "CNI_ARGS": args,
        }

    def call(
        self,
        verb: str,
        binary: str,
        conf: dict[str, Any],
        cid: str,
        netns: str,
        ifname: str = "eth0",
        args: str = "IgnoreUnknown=1",
    ) -> float:
        data = json.dumps(conf).encode()
        env = self.env(verb, cid, netns, ifname, args)
        # nsenter-free: the binary runs in the node namespace through `ip netns exec`,
        # whose own cost is measured separately and subtracted (see `baseline`).
        start = time.perf_counter()
        done = subprocess.run(
            ["ip", "netns", "exec", self.node, binary], input=data, env=env, capture_output=True
        )
        took = (time.perf_counter() - start) * 1000
        if done.returncode != 0:
            raise RuntimeError(f"{binary} {verb} failed: {done.stdout!r} {done.stderr!r}")
        return took

    def pod(self) -> str:
        self.count += 1
        name = f"pxb-pod-{self.tag}-{self.count}"
        sh("ip", "netns", "add", name)
        return name

    def close(self) -> None:
        self.stop_daemons()
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            name = line.split()[0]
            if self.tag in name:
                subprocess.run(["ip", "netns", "del", name], capture_output=True)


def one_add(
    bench: Bench, binary: str, conf: dict[str, Any], args: str = "IgnoreUnknown=1"
) -> float:
    """Time one ADD on a fresh pod namespace, then DEL it (untimed)."""
    pod = bench.pod()
    cid = f"bench-{bench.tag}-{bench.count}"
    took = bench.call("ADD", binary, conf, cid, f"/run/netns/{pod}", args=args)
    bench.call("DEL", binary, conf, cid, f"/run/netns/{pod}", args=args)
    sh("ip", "netns", "del", pod)
    return took


def raw_add(bench: Bench, extras: int) -> float:
    """The delegates themselves, exec'd one after the other."""
    pod = bench.pod()
    cid = f"bench-{bench.tag}-{bench.count}"
    netns = f"/run/netns/{pod}"
    nets = [("bridge", bench.bridge(), "eth0")] + [
        ("macvlan", bench.macvlan(i), f"net{i + 1}") for i in range(extras)
    ]
    total = 0.0
    for plugin, conf, ifname in nets:
        total += bench.call("ADD", str(bench.bin / plugin), conf, cid, netns, ifname)
    for plugin, conf, ifname in reversed(nets):
        bench.call("DEL", str(bench.bin / plugin), conf, cid, netns, ifname)
    sh("ip", "netns", "del", pod)
    return total


def baseline(bench: Bench) -> float:
    """`ip netns exec` + an empty exec, to subtract from every timing."""
    start = time.perf_counter()
    subprocess.run(["ip", "netns", "exec", bench.node, "/bin/true"], check=True)
    return (time.perf_counter() - start) * 1000

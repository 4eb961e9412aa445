"""ADD latency: Plexus (shim + daemon, thin) vs Multus thin vs the raw delegates.

Every contender attaches the same networks: reference `bridge` + host-local as the
default network, plus N macvlan secondaries (host-local) on a veth master, in a
private "node" namespace; the two "default only" columns attach the default network
alone (raw, and through Plexus: its own overhead without secondaries). Rounds
interleave the contenders; each ADD is followed by an untimed DEL on a fresh pod
namespace. Prints a markdown table of medians.

    sudo .venv/bin/python3 -m tests.bench.bench_add --runs 30 --extras 1,2,4,8
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from meta.install import install_binaries

REFERENCE = Path("/usr/lib/cni")
GO_TOOLS = Path(os.environ.get("PLEXUS_GO_TOOLS", "/var/cache/plexus-go-tools")) / "bin"


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
        self.daemon: subprocess.Popen[bytes] | None = None
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
            )
        else:
            conf.update(cniDir=str(self.root / "multus"), logLevel="panic")
        return conf

    def start_daemon(self, extras: int) -> None:
        config = self.root / "daemon.json"
        config.write_text(
            json.dumps(self.meta("plexus", extras, socketDir=str(self.root / "run"), metricsPort=0))
        )
        plexus = Path(sys.executable).parent / "plexus"
        self.daemon = subprocess.Popen(
            ["ip", "netns", "exec", self.node, str(plexus), "daemon", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        while not (self.root / "run" / "plexus.sock").exists():
            assert self.daemon.poll() is None, "daemon failed to start"
            time.sleep(0.05)

    def stop_daemon(self) -> None:
        if self.daemon is not None:
            self.daemon.send_signal(signal.SIGTERM)
            self.daemon.wait()
            self.daemon = None

    def call(
        self,
        verb: str,
        binary: str,
        conf: dict[str, Any],
        cid: str,
        netns: str,
        ifname: str = "eth0",
    ) -> float:
        env = {
            "PATH": os.environ["PATH"],
            "CNI_COMMAND": verb,
            "CNI_CONTAINERID": cid,
            "CNI_NETNS": netns,
            "CNI_IFNAME": ifname,
            "CNI_PATH": str(self.bin),
            "CNI_ARGS": "IgnoreUnknown=1",
        }
        data = json.dumps(conf).encode()
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
        self.stop_daemon()
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            name = line.split()[0]
            if self.tag in name:
                subprocess.run(["ip", "netns", "del", name], capture_output=True)


def one_add(bench: Bench, binary: str, conf: dict[str, Any]) -> float:
    """Time one ADD on a fresh pod namespace, then DEL it (untimed)."""
    pod = bench.pod()
    cid = f"bench{bench.count}"
    took = bench.call("ADD", binary, conf, cid, f"/run/netns/{pod}")
    bench.call("DEL", binary, conf, cid, f"/run/netns/{pod}")
    sh("ip", "netns", "del", pod)
    return took


def raw_add(bench: Bench, extras: int) -> float:
    """The delegates themselves, exec'd one after the other."""
    pod = bench.pod()
    cid = f"bench{bench.count}"
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


def shim_round_trip(runs: int) -> dict[str, float]:
    """VERSION through shim + daemon, and the daemon's idle RSS, against an empty exec."""
    root = Path(tempfile.mkdtemp(prefix="plexus-bench-"))
    bench = Bench(root)
    try:
        bench.start_daemon(1)
        assert bench.daemon is not None
        conf = bench.meta("plexus", 1, socketDir=str(root / "run"))
        shim, thin = str(bench.bin / "plexus"), str(bench.bin / "plexus-thin")
        rounds = [
            (
                baseline(bench),
                bench.call("VERSION", shim, conf, "v", ""),
                bench.call("VERSION", thin, conf, "v", ""),
            )
            for _ in range(runs)
        ]
        status = Path(f"/proc/{bench.daemon.pid}/status").read_text()
        rss = next(
            int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:")
        )
        base = statistics.median(r[0] for r in rounds)
        return {
            "shim+daemon VERSION (ms)": statistics.median(r[1] for r in rounds) - base,
            "plexus-thin VERSION (ms)": statistics.median(r[2] for r in rounds) - base,
            "daemon idle RSS (MiB)": rss / 1024,
        }
    finally:
        bench.close()
        shutil.rmtree(root, ignore_errors=True)


def measure(runs: int, extras_list: list[int]) -> list[dict[str, Any]]:
    root = Path(tempfile.mkdtemp(prefix="plexus-bench-"))
    bench = Bench(root)
    rows = []
    try:
        for extras in extras_list:
            bench.start_daemon(extras)
            shim, thin = str(bench.bin / "plexus"), str(bench.bin / "plexus-thin")
            sockets = str(root / "run")
            contenders: dict[str, Callable[[], float]] = {
                "raw default only": partial(raw_add, bench, 0),
                "raw delegates": partial(raw_add, bench, extras),
                "plexus default only": partial(
                    one_add, bench, shim, bench.meta("plexus", 0, socketDir=sockets)
                ),
                "plexus shim+daemon": partial(
                    one_add, bench, shim, bench.meta("plexus", extras, socketDir=sockets)
                ),
                "plexus thin": partial(one_add, bench, thin, bench.meta("plexus", extras)),
            }
            if (bench.bin / "multus").exists():
                contenders["multus thin"] = partial(
                    one_add, bench, str(bench.bin / "multus"), bench.meta("multus", extras)
                )
            samples: dict[str, list[float]] = {name: [] for name in contenders}
            samples["exec baseline"] = []
            for run in contenders.values():
                run()  # warm-up, not counted
            for _ in range(runs):
                samples["exec baseline"].append(baseline(bench))
                for name, run in contenders.items():
                    samples[name].append(run())
            base = statistics.median(samples.pop("exec baseline"))
            medians = {name: statistics.median(v) - base for name, v in samples.items()}
            rows.append({"extras": extras, "runs": runs, "baseline_ms": base, **medians})
            bench.stop_daemon()
    finally:
        bench.close()
        shutil.rmtree(root, ignore_errors=True)
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    names = [k for k in rows[0] if k not in ("extras", "runs", "baseline_ms")]
    lines = [
        "| secondary macvlans | "
        + " | ".join(f"{n} (ms)" for n in names)
        + " | plexus/multus | plexus over raw default |",
        "|---" * (len(names) + 3) + "|",
    ]
    for row in rows:
        cells = [f"{row[n]:.1f}" for n in names]
        ratio = (
            f"{row['plexus shim+daemon'] / row['multus thin']:.2f}x"
            if "multus thin" in row
            else "n/a"
        )
        overhead = f"{row['plexus shim+daemon'] - row['raw default only']:+.1f} ms"
        lines.append(f"| {row['extras']} | " + " | ".join(cells) + f" | {ratio} | {overhead} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--extras", default="1,2,4,8")
    args = parser.parse_args()
    rows = measure(args.runs, [int(x) for x in args.extras.split(",")])
    print(render(rows))
    print(
        f"\nmedians of {args.runs} runs; `ip netns exec` baseline "
        f"({rows[0]['baseline_ms']:.1f} ms) subtracted\n"
    )
    for name, value in shim_round_trip(args.runs).items():
        print(f"- {name}: {value:.1f}")


if __name__ == "__main__":
    main()

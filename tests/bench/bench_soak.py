"""Soak: ADD/DEL cycles through the shim and the daemon while the daemon is SIGKILLed
and restarted at random and pod namespaces vanish before their DEL; then GC, and
`plexus inspect` must find the node clean. A benchmark, not a test: it prints counts.

Every cycle is one pod (default network `bridge` + a macvlan NAD, host-local IPAM),
as kubelet drives it: ADD; on failure DEL (containerd tears a failed sandbox down);
then DEL, retried until it succeeds. With the daemon dead the shim runs thin mode, so
thin and daemon calls mix. Workers run cycles in parallel.

    sudo .venv/bin/python3 -m tests.bench.bench_soak --cycles 2000
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.netns.conftest import Node, sh
from tests.netns.daemon import Daemon

PLEXUS = Path(sys.executable).with_name("plexus")
DEL_ATTEMPTS = 20


class Soak:
    """One node, its daemon, and the counts of what happened."""

    def __init__(self, root: Path, seed: int) -> None:
        self.node = Node(root)
        self.node.nad("macvlan-net", self.node.macvlan_conf())
        self.daemon = Daemon(self.node)
        self.counts: Counter[str] = Counter()
        self.random = random.Random(seed)
        self._daemon_lock = threading.Lock()
        self._stop = threading.Event()

    def kill_daemon_now_and_then(self, mean_interval: float) -> None:
        """SIGKILL the daemon (the one this bench started, by PID) at random times."""
        while not self._stop.wait(self.random.expovariate(1 / mean_interval)):
            with self._daemon_lock:
                self.daemon.stop(signal.SIGKILL)
                self.counts["daemon SIGKILLs"] += 1
                # down for a while: calls meanwhile run in thin mode
                time.sleep(self.random.uniform(0, 1))
                self.daemon.start()

    def cycle(self, i: int, netns_loss: float) -> None:
        pod, cid = f"s{i}", f"c-s{i}"
        self.node.pod(pod, "macvlan-net")
        name = f"pxt-soak-{self.node.tag}-{i}"
        sh("ip", "netns", "add", name)
        netns = f"/run/netns/{name}"
        added = self.node.cni("ADD", netns=netns, cid=cid, pod=pod)
        if added.returncode == 0:
            self.counts["ADD ok"] += 1
        else:
            self.counts[f"ADD failed (code {_code(added.stdout)})"] += 1
        if self.random.random() < netns_loss:
            sh("ip", "netns", "del", name)
            self.counts["netns deleted before DEL"] += 1
        for attempt in range(1, DEL_ATTEMPTS + 1):
            if self.node.cni("DEL", netns=netns, cid=cid, pod=pod).returncode == 0:
                break
            self.counts["DEL retried"] += 1
            time.sleep(0.2 * attempt)
        else:
            self.counts["DEL never succeeded"] += 1
        sh("ip", "netns", "del", name, check=False)
        self.node.remove(f"pod-default-{pod}.yaml")

    def run(self, cycles: int, workers: int, kill_interval: float, netns_loss: float) -> None:
        self.daemon.start()
        killer = threading.Thread(target=self.kill_daemon_now_and_then, args=(kill_interval,))
        killer.start()
        started = time.monotonic()
        try:
            with ThreadPoolExecutor(workers) as pool:
                for done in pool.map(lambda i: self.cycle(i, netns_loss), range(cycles)):
                    del done
        finally:
            self._stop.set()
            killer.join()
        self.counts["seconds"] = round(time.monotonic() - started)
        self.node.added.clear()  # every cycle DELed its pod
        gc = self.node.cni("GC", conf=self.node.meta(**{"cni.dev/valid-attachments": []}))
        self.counts["final GC failed"] = int(gc.returncode != 0)

    def leftovers(self) -> dict[str, Any]:
        config = self.node.root / "inspect.json"
        config.write_text(json.dumps(self.node.meta()))
        done = subprocess.run(
            [str(PLEXUS), "inspect", "--config", str(config), "--json"],
            capture_output=True,
            text=True,
        )
        report = json.loads(done.stdout)
        cni_dir = self.node.cni_dir
        return {
            "inspect healthy": report["healthy"],
            "records": _count(cni_dir / "records"),
            "result cache files": _count(cni_dir / "results"),
            "lock files": _count(cni_dir / "locks"),
            "reserved IPs": len(self.node.reserved_ips()),
            "links in the node netns": len(self.node.links(f"/run/netns/{self.node.name}")),
        }

    def close(self) -> None:
        self.daemon.stop()
        self.node.close()


def _code(stdout: str) -> object:
    try:
        return json.loads(stdout).get("code")
    except (ValueError, AttributeError):
        return "none"


def _count(directory: Path) -> int:
    return (
        sum(1 for p in directory.iterdir() if not p.name.startswith("."))
        if directory.exists()
        else 0
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument(
        "--kill-interval", type=float, default=5.0, help="mean seconds between kills"
    )
    parser.add_argument(
        "--netns-loss", type=float, default=0.1, help="share of pods whose netns goes"
    )
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="plexus-soak-") as tmp:
        soak = Soak(Path(tmp), args.seed)
        try:
            soak.run(args.cycles, args.workers, args.kill_interval, args.netns_loss)
            left = soak.leftovers()
        finally:
            soak.close()
    print(f"{args.cycles} cycles, {args.workers} workers, seed {args.seed}")
    for key, value in sorted(soak.counts.items()):
        print(f"  {key}: {value}")
    print("after the final GC:")
    for key, value in left.items():
        print(f"  {key}: {value}")
    clean = left["inspect healthy"] and not any(
        left[k] for k in ("records", "result cache files", "lock files", "reserved IPs")
    )
    print("clean" if clean else "LEAKED")
    sys.exit(0 if clean else 1)


if __name__ == "__main__":
    main()

"""macvlan + host-local ADD: in-process vs our standalone binary vs the reference binary.

Same config for all three, in a private node namespace (veth master) with a fresh
pod namespace per ADD; DEL untimed. The exec'd contenders run under `ip netns exec`,
whose cost (measured as an exec of /bin/true) is subtracted; the in-process one runs
on a thread that enters the node namespace, as the daemon does.

    sudo .venv/bin/python3 -m tests.bench.bench_macvlan --runs 30
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cni import skel
from cni.env import cmd_args_from_env
from delegates.macvlan import MacvlanPlugin
from delegates.netns import run_in_netns
from tests.bench.common import Bench, baseline, sh


def _env(bench: Bench, verb: str, cid: str, netns: str) -> dict[str, str]:
    return {
        "CNI_COMMAND": verb,
        "CNI_CONTAINERID": cid,
        "CNI_NETNS": netns,
        "CNI_IFNAME": "net1",
        "CNI_PATH": str(bench.bin),
        "CNI_ARGS": "IgnoreUnknown=1",
    }


def _exec_add(bench: Bench, binary: str) -> float:
    pod = bench.pod()
    cid, netns, conf = f"m{bench.count}", f"/run/netns/{pod}", bench.macvlan(0)
    took = bench.call("ADD", binary, conf, cid, netns, "net1")
    bench.call("DEL", binary, conf, cid, netns, "net1")
    sh("ip", "netns", "del", pod)
    return took


def _in_process_add(bench: Bench) -> float:
    pod = bench.pod()
    cid, netns = f"m{bench.count}", f"/run/netns/{pod}"
    data = json.dumps(bench.macvlan(0)).encode()
    plugin = MacvlanPlugin()

    def call(verb: str) -> None:
        skel.dispatch(plugin, cmd_args_from_env(_env(bench, verb, cid, netns), data))

    start = time.perf_counter()
    run_in_netns(f"/run/netns/{bench.node}", lambda: call("ADD"))
    took = (time.perf_counter() - start) * 1000
    run_in_netns(f"/run/netns/{bench.node}", lambda: call("DEL"))
    sh("ip", "netns", "del", pod)
    return took


def measure(runs: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="plexus-bench-"))
    bench = Bench(root)
    try:
        contenders: dict[str, Callable[[], float]] = {
            "in-process (daemon path)": lambda: _in_process_add(bench),
            "plexus-macvlan binary": lambda: _exec_add(bench, str(bench.bin / "plexus-macvlan")),
            "reference macvlan binary": lambda: _exec_add(bench, str(bench.bin / "macvlan")),
        }
        for run in contenders.values():
            run()  # warm-up
        samples: dict[str, list[float]] = {name: [] for name in contenders}
        bases = []
        for _ in range(runs):
            bases.append(baseline(bench))
            for name, run in contenders.items():
                samples[name].append(run())
        base = statistics.median(bases)
        return {
            name: statistics.median(v) - (0 if name.startswith("in-process") else base)
            for name, v in samples.items()
        }
    finally:
        bench.close()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    medians = measure(args.runs)
    reference = medians["reference macvlan binary"]
    print("| macvlan + host-local ADD | median (ms) | vs reference |\n|---|---|---|")
    for name, value in medians.items():
        print(f"| {name} | {value:.1f} | {value / reference:.2f}x |")
    print(f"\nmedians of {args.runs} runs")


if __name__ == "__main__":
    main()

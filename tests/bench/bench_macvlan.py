"""macvlan + host-local ADD: in-process vs our standalone binary vs the reference binary.

Same config for all three, in a private node namespace (veth master) with a fresh
pod namespace per ADD; DEL untimed. The exec'd contenders run under `ip netns exec`,
whose cost (measured as an exec of /bin/true) is subtracted; the in-process one runs
through the daemon's executor (delegates.builtin, with the default delegate timeout)
from a thread that enters the node namespace.

    sudo .venv/bin/python3 -m tests.bench.bench_macvlan --runs 30

`--against DIR` instead times only the in-process ADD, alternated ADD by ADD with the
same ADD run by the code of another checkout (a worktree at DIR), so that both see the
same load on a shared machine: one worker process per checkout, medians of --runs each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from cni import callscope
from delegates.builtin import BuiltinExecutor
from delegates.netns import run_in_netns
from tests.bench.common import Bench, baseline, sh

DELEGATE_TIMEOUT = 30.0  # delegateTimeoutSeconds' default


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
    executor = BuiltinExecutor()

    def call(verb: str) -> None:
        with callscope.call_scope() as scope:  # bounded as the daemon's calls are
            scope.timeout = DELEGATE_TIMEOUT
            executor.run("macvlan", data, _env(bench, verb, cid, netns))

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


def _serve() -> None:
    """A worker for --against: one in-process ADD per line read, its time (ms) printed."""
    root = Path(tempfile.mkdtemp(prefix="plexus-bench-"))
    bench = Bench(root)
    try:
        for _ in sys.stdin:
            print(f"{_in_process_add(bench):.4f}", flush=True)
    finally:
        bench.close()
        shutil.rmtree(root, ignore_errors=True)


def against(other: Path, runs: int) -> tuple[float, float]:
    """Medians (ms) of this checkout's in-process ADD and `other`'s, alternated."""
    trees = (Path(__file__).resolve().parents[2], other.resolve())
    workers = [
        subprocess.Popen(
            [sys.executable, __file__, "--serve"],
            cwd=tree,
            env={**os.environ, "PYTHONPATH": str(tree)},  # the checkout's own packages
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for tree in trees
    ]
    samples: tuple[list[float], list[float]] = ([], [])
    try:
        for run in range(runs + 1):  # the first round warms both up
            for k in (0, 1) if run % 2 else (1, 0):
                stdin, stdout = workers[k].stdin, workers[k].stdout
                assert stdin is not None and stdout is not None
                stdin.write("\n")
                stdin.flush()
                took = float(stdout.readline())
                if run:
                    samples[k].append(took)
    finally:
        for worker in workers:
            if worker.stdin is not None:
                worker.stdin.close()
            worker.wait()
    return statistics.median(samples[0]), statistics.median(samples[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--against", type=Path, help="another checkout to alternate with")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _serve()
        return
    if args.against:
        load = os.getloadavg()[0]
        mine, theirs = against(args.against, args.runs)
        print(
            f"in-process ADD, medians of {args.runs} alternated, load {load:.1f} -> "
            f"{os.getloadavg()[0]:.1f}: this checkout {mine:.2f} ms, {args.against} "
            f"{theirs:.2f} ms ({mine / theirs:.2f}x)"
        )
        return
    medians = measure(args.runs)
    reference = medians["reference macvlan binary"]
    print("| macvlan + host-local ADD | median (ms) | vs reference |\n|---|---|---|")
    for name, value in medians.items():
        print(f"| {name} | {value:.1f} | {value / reference:.2f}x |")
    print(f"\nmedians of {args.runs} runs")


if __name__ == "__main__":
    main()

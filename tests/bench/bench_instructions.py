"""Instructions per in-process macvlan + host-local ADD, counted by callgrind.

Wall-clock medians on this shared 2-core machine move with the load other work puts on
it; instruction counts do not. The same in-process ADD as bench_macvlan runs in a child
Python under `valgrind --tool=callgrind` twice, with 1 and with 1 + N ADDs (each into its
own pod namespace, made beforehand by this process), so imports and start-up cancel out
and the difference / N is one ADD.

    sudo .venv/bin/python3 -m tests.bench.bench_instructions --adds 20
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.bench.common import Bench

_COLLECTED = re.compile(rb"Collected : (\d+)")


def _child(node: str, conf: str, pods: list[str]) -> None:
    """Run one in-process ADD into each pod namespace (what callgrind counts)."""
    from functools import partial

    from cni import skel
    from cni.env import cmd_args_from_env
    from delegates.macvlan import MacvlanPlugin
    from delegates.netns import run_in_netns

    plugin = MacvlanPlugin()
    for pod in pods:
        env = {
            "CNI_COMMAND": "ADD",
            "CNI_CONTAINERID": pod,
            "CNI_NETNS": f"/run/netns/{pod}",
            "CNI_IFNAME": "net1",
            "CNI_PATH": "/nonexistent",
            "CNI_ARGS": "IgnoreUnknown=1",
        }
        args = cmd_args_from_env(env, conf.encode())
        run_in_netns(f"/run/netns/{node}", partial(skel.dispatch, plugin, args))


def _count(bench: Bench, conf: str, adds: int, out: Path) -> int:
    pods = [bench.pod() for _ in range(adds)]
    cmd = [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        "tests.bench.bench_instructions",
        "--child",
        json.dumps([bench.node, conf, pods]),
    ]
    done = subprocess.run(cmd, capture_output=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"callgrind run failed: {done.stderr[-2000:]!r}")
    found = _COLLECTED.findall(done.stderr)
    if not found:
        raise RuntimeError(f"no instruction count in callgrind's output: {done.stderr[-500:]!r}")
    return int(found[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--adds", type=int, default=20)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(*json.loads(args.child))
        return
    root = Path(tempfile.mkdtemp(prefix="plexus-bench-"))
    bench = Bench(root)
    try:
        conf = json.dumps(bench.macvlan(0))
        base = _count(bench, conf, 1, root / "callgrind.base")
        more = _count(bench, conf, 1 + args.adds, root / "callgrind.more")
    finally:
        bench.close()
        shutil.rmtree(root, ignore_errors=True)
    per_add = (more - base) / args.adds
    print(f"instructions per in-process macvlan + host-local ADD: {per_add / 1e6:.2f} M")
    print(f"(callgrind: {base} with 1 ADD, {more} with {1 + args.adds})")


if __name__ == "__main__":
    main()

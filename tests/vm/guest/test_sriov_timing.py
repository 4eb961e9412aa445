"""sriov ADD in-process (as the daemon runs it) vs the standalone `plexus-sriov` binary,
on a real igb VF: both must give the same result; their timings go to the results dir
(`sriov-timing.json`) for docs/performance.md. Under TCG emulation the binary's Python
start-up is far slower than on hardware, so the ratio overstates the daemon's advantage."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from meta.install import install_binaries
from tests.vm.guest.conftest import NumVfs, Pf, enable_vfs, pf_up, sh, sriov_call, sriov_conf

RUNS = 3


def _binary(binary: Path, verb: str, conf: dict[str, Any], netns: str) -> dict[str, Any]:
    env = {
        "CNI_COMMAND": verb,
        "CNI_CONTAINERID": "bench",
        "CNI_NETNS": f"/run/netns/{netns}",
        "CNI_IFNAME": "net1",
        "CNI_PATH": "/usr/lib/cni",
        "PATH": os.environ["PATH"],
    }
    proc = subprocess.run([binary], input=json.dumps(conf).encode(), env=env, capture_output=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout) if proc.stdout.strip() else {}


def test_sriov_add_in_process_vs_binary(
    igb_pf: Pf, netns: Callable[[], str], tmp_path: Path, results_dir: Path
) -> None:
    pf_up(igb_pf)
    vfs: NumVfs = enable_vfs(igb_pf, 1)
    (binary,) = (p for p in install_binaries(tmp_path / "bin") if p.name == "plexus-sriov")
    conf = sriov_conf(
        vfs[0][0],
        tmp_path / "data",
        vlan=100,
        mac="02:00:00:00:40:01",
        ipam={"type": "static", "addresses": [{"address": "10.78.0.1/24"}]},
    )
    ns = netns()
    contenders: dict[str, Callable[[str], dict[str, Any]]] = {
        "in-process": lambda verb: json.loads(sriov_call(verb, conf, ns, cid="bench") or b"{}"),
        "plexus-sriov binary": lambda verb: _binary(binary, verb, conf, ns),
    }
    took: dict[str, list[float]] = {name: [] for name in contenders}
    results = {}
    try:
        for _ in range(RUNS):
            for name, call in contenders.items():
                start = time.perf_counter()
                results[name] = call("ADD")
                took[name].append((time.perf_counter() - start) * 1000)
                call("DEL")
    finally:
        sh("ip", "link", "set", igb_pf.netdev, "down")
    assert results["in-process"] == results["plexus-sriov binary"]
    assert results["in-process"]["interfaces"][0]["mac"] == "02:00:00:00:40:01"
    medians = {name: statistics.median(values) for name, values in took.items()}
    (results_dir / "sriov-timing.json").write_text(json.dumps({"runs": RUNS, "median_ms": medians}))
    print(f"sriov ADD medians over {RUNS} runs (ms): {medians}")

"""SR-IOV provisioning: time from a policy to its VFs advertised by the device plugin, on the
VM's igb (QEMU, software emulation), against writing `sriov_numvfs` by hand under an
already-serving device plugin (the floor any provisioning pays). One VM boot runs both,
interleaved (tests/bench/guest_provision.py).

    sudo .venv/bin/python3 -m tests.bench.bench_provision --runs 10
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.vm import vm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--vfs", type=int, default=4)
    args = parser.parse_args()
    missing = vm.missing_tooling()
    if missing:
        sys.exit(f"bench_provision: VM tooling missing: {', '.join(missing)} (run make setup)")
    results_dir = Path(tempfile.mkdtemp(prefix="pxbench-prov-"))
    out = results_dir / "provision.json"
    command = (
        f"cd {shlex.quote(str(vm.REPO))} && {shlex.quote(vm.guest_python())} -m "
        f"tests.bench.guest_provision --rounds {args.runs} --vfs {args.vfs} --out {out}"
    )
    env = {"PATH": f"{vm.VNG_BIN}:/usr/bin:/bin:/usr/sbin:/sbin"}
    done = subprocess.run(
        vm.vng_argv(results_dir, command), env=env, capture_output=True, text=True, timeout=3600
    )
    if not out.exists():
        sys.exit(f"bench_provision: no results (exit {done.returncode}):\n{done.stdout[-3000:]}")
    results = json.loads(out.read_text())
    policy, by_hand = statistics.median(results["policy"]), statistics.median(results["by_hand"])
    print(f"| {args.vfs} VFs on QEMU igb (TCG) | median (ms) |\n|---|---|")
    print(f"| policy -> advertised (Plexus) | {policy:.0f} |")
    print(f"| of which the node pass | {statistics.median(results['pass']):.0f} |")
    print(f"| of which sriov_numvfs + VF drivers | {statistics.median(results['numvfs']):.0f} |")
    print(f"| sriov_numvfs by hand -> advertised (anchor) | {by_hand:.0f} |")
    print(f"\nratio {policy / by_hand:.2f}x the anchor; medians of {args.runs} interleaved rounds")


if __name__ == "__main__":
    main()

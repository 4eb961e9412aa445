"""Device plugin: discovery, Allocate over gRPC, and health-change latency.

- discovery: a full rescan (sysfs walk, selectors, health) of a FAKE sysfs tree shaped
  like a big SR-IOV host (the host has no SR-IOV): `--pfs` PFs with `--vfs` VFs each;
- Allocate: the kubelet's call over the plugin's unix socket, one device and eight
  (device-info files are written when devices enter the pool; Allocate checks them);
- health: `ip link set <pf> down` to the Unhealthy update on ListAndWatch, for the
  plugin process in a node namespace whose fake PF netdev is a real veth (the kernel
  event path of tests/netns/test_deviceplugin.py).

    sudo .venv/bin/python3 -m tests.bench.bench_deviceplugin --runs 30
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from deviceplugin.config import parse_config
from deviceplugin.kubelet import deviceplugin_pb2 as pb
from deviceplugin.plugin import DevicePluginRunner, PluginOptions, socket_name
from deviceplugin.server import HostPaths
from tests.bench.common import sh
from tests.kubelet import next_until, plugin_stub, serve_registration
from tests.unit.deviceplugin.fake_sysfs import FakeSysfs

RESOURCE = "intel.com/bench_vf"
CONFIG = {"resourceList": [{"resourceName": "bench_vf", "selectors": {"devices": ["154c"]}}]}


def _fake_host(root: Path, pfs: int, vfs: int) -> list[str]:
    sysfs = FakeSysfs(root)
    addresses = []
    for p in range(pfs):
        pf = f"0000:{0x3B + p:02x}:00.0"
        sysfs.add_pf(pf, f"ens{p}f0", totalvfs=vfs, numa_node=p % 2)
        for v in range(vfs):
            addr = f"0000:{0x3B + p:02x}:{2 + v // 8:02x}.{v % 8}"
            sysfs.add_vf(pf, v, addr, netdev=f"ens{p}f0v{v}", numa_node=p % 2)
            addresses.append(addr)
    return addresses


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def discovery_and_allocate(work: Path, runs: int, pfs: int, vfs: int) -> dict[str, float]:
    addresses = _fake_host(work / "sys", pfs, vfs)
    plugins = work / "dp"
    plugins.mkdir()
    options = PluginOptions(
        paths=HostPaths(str(work / "sys"), "/dev", str(work / "devinfo")), plugins_dir=plugins
    )
    runner = DevicePluginRunner(parse_config(json.dumps(CONFIG)), options)
    scans = []
    for _ in range(runs):
        start = time.perf_counter()
        runner.scan()
        scans.append(_ms(start))
    thread = threading.Thread(target=runner.run)
    thread.start()
    one: list[float] = []
    eight: list[float] = []
    try:
        with plugin_stub(plugins / socket_name(RESOURCE)) as stub:
            for i in range(runs):
                for ids, out in ((addresses[i : i + 1], one), (addresses[i : i + 8], eight)):
                    request = pb.AllocateRequest(
                        container_requests=[pb.ContainerAllocateRequest(devices_ids=ids)]
                    )
                    start = time.perf_counter()
                    stub.Allocate(request, timeout=10)
                    out.append(_ms(start))
    finally:
        runner.stop()
        thread.join()
    return {
        f"discovery of {len(addresses)} VFs on {pfs} PFs": statistics.median(scans),
        "Allocate, 1 device": statistics.median(one),
        "Allocate, 8 devices": statistics.median(eight),
    }


def health(work: Path, runs: int) -> float:
    node = f"pxb-dp-{int(time.time() * 1000) % 100000}"
    sh("ip", "netns", "add", node)
    proc: subprocess.Popen[bytes] | None = None
    try:
        sh("ip", "-n", node, "link", "add", "pf0", "type", "veth", "peer", "name", "pf0p")
        sh("ip", "-n", node, "link", "set", "pf0p", "up")
        sh("ip", "-n", node, "link", "set", "pf0", "up")
        sysfs = FakeSysfs(work / "hsys")
        sysfs.add_pf("0000:3b:00.0", "pf0", real_netdev=True)
        sysfs.add_vf("0000:3b:00.0", 0, "0000:3b:02.0", netdev="pf0v0")
        config = work / "config.json"
        config.write_text(json.dumps(CONFIG))
        plugins = work / "hdp"
        plugins.mkdir()
        with serve_registration(plugins / "kubelet.sock") as kubelet:
            plexus = str(Path(sys.executable).with_name("plexus"))
            proc = subprocess.Popen(
                [
                    "ip",
                    "netns",
                    "exec",
                    node,
                    plexus,
                    "deviceplugin",
                    "--config",
                    str(config),
                    "--sysfs-root",
                    str(sysfs.root),
                    "--plugins-dir",
                    str(plugins),
                    "--devinfo-dir",
                    str(work / "hdevinfo"),
                ],
                stderr=subprocess.DEVNULL,
            )
            kubelet.wait_for(1, timeout=30)
            took = []
            with plugin_stub(plugins / socket_name(RESOURCE)) as stub:
                stream = stub.ListAndWatch(pb.Empty(), timeout=600)
                next(stream)
                for _ in range(runs):
                    start = time.perf_counter()
                    sh("ip", "-n", node, "link", "set", "pf0", "down")
                    next_until(stream, lambda d: d["0000:3b:02.0"][0] == "Unhealthy")
                    took.append(_ms(start))
                    sh("ip", "-n", node, "link", "set", "pf0", "up")
                    next_until(stream, lambda d: d["0000:3b:02.0"][0] == "Healthy")
            return statistics.median(took)
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=15)
        sh("ip", "netns", "del", node)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--pfs", type=int, default=4)
    parser.add_argument("--vfs", type=int, default=64)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pxb-"))
    try:
        results = discovery_and_allocate(work, args.runs, args.pfs, args.vfs)
        results["PF link down -> Unhealthy on ListAndWatch"] = health(work, args.runs)
    finally:
        shutil.rmtree(work)
    print("| device plugin | median (ms) |\n|---|---|")
    for name, value in results.items():
        print(f"| {name} | {value:.2f} |")
    print(f"\nmedians of {args.runs} runs")


if __name__ == "__main__":
    main()

"""The guest side of bench_provision (runs inside the VM, as root, on QEMU's igb PF).

Interleaved rounds of two ways to get N VFs advertised by one running device plugin (in
process, registering with a FAKE kubelet registration service: the VM runs no kubelet):

- policy: a SriovNetworkNodePolicy handed to the node pass (VFs created, MTU set), its
  pool given to the device plugin (a new resource: server started, registered), until
  ListAndWatch lists the N VFs;
- by hand (the anchor, the floor of any provisioning): `sriov_numvfs` written with the
  device plugin already serving a resource that selects the VFs, until it lists them.

Writes {"policy": [ms...], "by_hand": [ms...], "pass": [...], "numvfs": [...]} as JSON to
--out: the node pass, and within it the `sriov_numvfs` write with the wait for the VFs'
drivers (the kernel's share).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from deviceplugin.config import DevicePluginConfig, parse_config
from deviceplugin.kubelet import deviceplugin_pb2 as pb
from deviceplugin.plugin import DevicePluginRunner, PluginOptions, socket_name
from deviceplugin.provision.crs import NodePolicy
from deviceplugin.provision.holders import AllocationReader
from deviceplugin.provision.host import Host
from deviceplugin.provision.node import NodeProvisioner
from deviceplugin.provision.record import Records
from deviceplugin.server import HostPaths
from tests.kubelet import FakeKubeletRegistration, next_until, plugin_stub, serve_registration

PF = Path("/sys/bus/pci/devices/0000:01:00.0")
ANCHOR = {"resourceList": [{"resourceName": "by_hand", "selectors": {"devices": ["10ca"]}}]}


def _policy(netdev: str, count: int) -> NodePolicy:
    return NodePolicy.from_api(
        {
            "metadata": {"name": "bench", "namespace": "sriov-network-operator"},
            "spec": {"resourceName": "bench", "nodeSelector": {}, "numVfs": count,
                     "mtu": 1500, "nicSelector": {"pfNames": [netdev]}},
        }
    )  # fmt: skip


def _listed(socket: Path, count: int) -> None:
    with plugin_stub(socket) as stub:
        next_until(stub.ListAndWatch(pb.Empty(), timeout=120), lambda d: len(d) == count)


def _registered(kubelet: FakeKubeletRegistration, resource: str, before: int) -> None:
    kubelet.wait_for(before + 1, timeout=120)
    assert kubelet.requests[-1].resource_name == resource


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--vfs", type=int, default=4)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    subprocess.run(["modprobe", "igbvf"], check=True)
    (netdev,) = (p.name for p in (PF / "net").iterdir())
    subprocess.run(["ip", "link", "set", netdev, "up"], check=True)
    work = Path(tempfile.mkdtemp())
    plugins = work / "dp"
    plugins.mkdir()
    host = Host()
    prov = NodeProvisioner(host, Records(work / "records"), AllocationReader(None, None))
    results: dict[str, list[float]] = {"policy": [], "by_hand": [], "pass": [], "numvfs": []}
    set_num_vfs = host.set_num_vfs

    def timed_set_num_vfs(pf: str, count: int) -> None:
        started = time.perf_counter()
        set_num_vfs(pf, count)
        if count:
            results["numvfs"].append((time.perf_counter() - started) * 1000)

    host.set_num_vfs = timed_set_num_vfs  # type: ignore[method-assign]
    with serve_registration(plugins / "kubelet.sock") as kubelet:
        runner = DevicePluginRunner(
            DevicePluginConfig(resource_list=[]),
            PluginOptions(paths=HostPaths(devinfo_dir=str(work / "devinfo")), plugins_dir=plugins),
        )
        serving = threading.Thread(target=runner.run)
        serving.start()
        try:
            for _ in range(args.rounds):
                before = len(kubelet.requests)
                started = time.perf_counter()
                result = prov.reconcile([_policy(netdev, args.vfs)], {})
                results["pass"].append((time.perf_counter() - started) * 1000)
                runner.set_config(DevicePluginConfig(resource_list=result.resources))
                _registered(kubelet, "openshift.io/bench", before)
                _listed(plugins / socket_name("openshift.io/bench"), args.vfs)
                results["policy"].append((time.perf_counter() - started) * 1000)
                runner.set_config(
                    DevicePluginConfig(resource_list=prov.reconcile([], {}).resources)
                )

                before = len(kubelet.requests)
                runner.set_config(parse_config(json.dumps(ANCHOR)))
                _registered(kubelet, "intel.com/by_hand", before)
                _listed(plugins / socket_name("intel.com/by_hand"), 0)
                started = time.perf_counter()
                (PF / "sriov_numvfs").write_text(str(args.vfs))
                _listed(plugins / socket_name("intel.com/by_hand"), args.vfs)
                results["by_hand"].append((time.perf_counter() - started) * 1000)
                (PF / "sriov_numvfs").write_text("0")
                runner.set_config(DevicePluginConfig(resource_list=[]))
        finally:
            runner.stop()
            serving.join(timeout=60)
            (PF / "sriov_numvfs").write_text("0")
    Path(args.out).write_text(json.dumps(results))


if __name__ == "__main__":
    main()

"""`plexus deviceplugin` serving QEMU's igb VFs: driven over its socket the way the
kubelet does, registering with a FAKE kubelet registration service (a real kubelet needs
a container runtime the VM does not run). Every change below is a real kernel event."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deviceplugin.kubelet import deviceplugin_pb2 as pb
from deviceplugin.plugin import socket_name
from tests.kubelet import Devices, next_until, plugin_stub, serve_registration
from tests.vm.guest.conftest import REPO, NumVfs, Pf, enable_vfs, pf_up, sh

RESOURCE = "intel.com/igb_vf"
VF_DEVICE = "10ca"


@pytest.fixture
def served(igb_pf: Pf, tmp_path: Path) -> Iterator[tuple[NumVfs, Path, Path]]:
    """Two VFs with the PF up, and the device plugin serving them; yields
    (VFs, the plugin socket, the device-info dir)."""
    pf_up(igb_pf)
    vfs = enable_vfs(igb_pf, 2)
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {"resourceList": [{"resourceName": "igb_vf", "selectors": {"devices": [VF_DEVICE]}}]}
        )
    )
    plugins = Path(tempfile.mkdtemp(prefix="pxdp-"))
    devinfo = tmp_path / "devinfo"
    cli = [sys.executable, "-c", "from meta.cli import main; main()", "deviceplugin"]
    log = (tmp_path / "dp.log").open("w")
    with serve_registration(plugins / "kubelet.sock") as kubelet:
        proc = subprocess.Popen(
            [
                *cli,
                "--config",
                str(config),
                "--plugins-dir",
                str(plugins),
                "--devinfo-dir",
                str(devinfo),
            ],
            cwd=REPO,
            stderr=log,
        )
        try:
            kubelet.wait_for(1, timeout=60)
            yield vfs, plugins / socket_name(RESOURCE), devinfo
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=30)
            log.close()
            sh("ip", "link", "set", igb_pf.netdev, "down")
    assert code == 0, (tmp_path / "dp.log").read_text()


def _all(state: str, count: int) -> Callable[[Devices], bool]:
    """`count` devices, every one in `state`."""
    return lambda d: len(d) == count and all(h == state for h, _ in d.values())


def test_list_allocate_and_health_on_real_vfs(
    igb_pf: Pf, served: tuple[NumVfs, Path, Path]
) -> None:
    vfs, socket, devinfo = served
    pcis = [pci for pci, _ in vfs]
    with plugin_stub(socket) as stub:
        stream = stub.ListAndWatch(pb.Empty(), timeout=120)
        assert sorted(next_until(stream, _all("Healthy", 2))) == pcis

        resp = stub.Allocate(
            pb.AllocateRequest(
                container_requests=[pb.ContainerAllocateRequest(devices_ids=pcis[:1])]
            ),
            timeout=10,
        )
        envs = dict(resp.container_responses[0].envs)
        assert envs["PCIDEVICE_INTEL_COM_IGB_VF"] == pcis[0]
        assert json.loads(envs["PCIDEVICE_INTEL_COM_IGB_VF_INFO"]) == {
            pcis[0]: {"generic": {"deviceID": pcis[0]}}
        }
        info = json.loads((devinfo / "dp" / f"intel.com-igb_vf-{pcis[0]}-device.json").read_text())
        assert info["pci"] == {"pci-address": pcis[0], "pf-pci-address": igb_pf.pci}

        pref = stub.GetPreferredAllocation(
            pb.PreferredAllocationRequest(
                container_requests=[
                    pb.ContainerPreferredAllocationRequest(
                        available_deviceIDs=pcis, must_include_deviceIDs=pcis[1:], allocation_size=2
                    )
                ]
            ),
            timeout=10,
        )
        assert list(pref.container_responses[0].deviceIDs) == [pcis[1], pcis[0]]

        # the PF's link goes down: every VF turns Unhealthy, then back
        started = time.monotonic()
        sh("ip", "link", "set", igb_pf.netdev, "down")
        next_until(stream, _all("Unhealthy", 2))
        print(f"PF down reported after {(time.monotonic() - started) * 1000:.0f} ms")
        sh("ip", "link", "set", igb_pf.netdev, "up")
        next_until(stream, _all("Healthy", 2))

        # a VF unbound from igbvf is Unhealthy; bound again, Healthy
        driver = Path("/sys/bus/pci/drivers/igbvf")
        (driver / "unbind").write_text(pcis[1])
        found = next_until(stream, lambda d: d.get(pcis[1], ("",))[0] == "Unhealthy")
        assert found[pcis[0]][0] == "Healthy"
        (driver / "bind").write_text(pcis[1])
        next_until(stream, _all("Healthy", 2))

        # VFs removed, then more created, at run time
        (igb_pf.sysfs / "sriov_numvfs").write_text("0")
        assert next_until(stream, lambda d: not d) == {}
        more = [pci for pci, _ in enable_vfs(igb_pf, 3)]
        assert sorted(next_until(stream, _all("Healthy", 3))) == more

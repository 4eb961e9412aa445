"""Device plugin discovery on the real sysfs of QEMU's igb PF and its igbvf VFs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from deviceplugin.sysfs import default_route_ifaces, discover
from tests.vm.guest.conftest import REPO, Pf, enable_vfs, pf_up, sh

VF_DEVICE = "10ca"


def test_discovery_sees_pf_and_vfs(igb_pf: Pf) -> None:
    vf_addrs = [pci for pci, _ in enable_vfs(igb_pf, 2)]
    devices = {d.address: d for d in discover("/sys", default_route_ifaces())}

    pf = devices[igb_pf.pci]
    assert (pf.vendor, pf.device, pf.driver) == ("8086", "10c9", "igb")
    assert pf.netdevs == (igb_pf.netdev,)
    assert (pf.sriov_numvfs, pf.sriov_totalvfs) == (2, 7)
    assert pf.has_vfs and not pf.is_vf
    assert pf.link_type == "ether"

    for index, addr in enumerate(vf_addrs):
        vf = devices[addr]
        assert (vf.vendor, vf.device, vf.driver) == ("8086", VF_DEVICE, "igbvf")
        assert vf.is_vf
        assert (vf.pf_address, vf.pf_netdev, vf.vf_index) == (igb_pf.pci, igb_pf.netdev, index)
        assert len(vf.netdevs) == 1 and vf.link_type == "ether"
        assert vf.sriov_numvfs is None
        assert not vf.default_route


def list_pools(config: Path) -> dict[str, list[dict[str, object]]]:
    """`plexus deviceplugin list` in a subprocess, on the real /sys."""
    cli = [sys.executable, "-c", "from meta.cli import main; main()"]
    proc = subprocess.run(
        [*cli, "deviceplugin", "list", "--config", str(config)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, list[dict[str, object]]] = json.loads(proc.stdout)
    return out


def test_cli_lists_both_vfs(igb_pf: Pf, tmp_path: Path) -> None:
    vf_addrs = [pci for pci, _ in enable_vfs(igb_pf, 2)]
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps(
            {
                "resourceList": [
                    {
                        "resourceName": "igb_vf",
                        "selectors": [{"vendors": ["8086"], "devices": [VF_DEVICE]}],
                    },
                    {"resourceName": "igb_pf", "selectors": [{"devices": ["10c9"]}]},
                ]
            }
        )
    )
    netdir = igb_pf.sysfs / "net" / igb_pf.netdev
    was_up = int((netdir / "flags").read_text(), 16) & 0x1  # IFF_UP
    try:
        # VF health follows the PF's link: down first ...
        sh("ip", "link", "set", igb_pf.netdev, "down")
        out = list_pools(config)
        assert out["intel.com/igb_pf"] == []  # the PF has VFs enabled: not offered
        entries = out["intel.com/igb_vf"]
        assert [e["id"] for e in entries] == vf_addrs
        for entry in entries:
            assert entry["pf"] == igb_pf.netdev
            assert entry["driver"] == "igbvf"
            assert entry["healthy"] is False
        # ... then up (the emulated link comes up a little later).
        pf_up(igb_pf)
        assert [e["healthy"] for e in list_pools(config)["intel.com/igb_vf"]] == [True, True]
    finally:  # leave the PF's admin state as we found it
        sh("ip", "link", "set", igb_pf.netdev, "up" if was_up else "down", check=False)

"""Smoke tests: the guest has what the ipvlan, VLAN and SR-IOV tiers rely on."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from tests.vm.guest.conftest import REPO, Pf, sh


def link(name: str, netns: str = "") -> dict[str, Any]:
    """`ip -d -j link show` for one link."""
    out = sh("ip", "-d", "-j", "link", "show", "dev", name, netns=netns).stdout
    info: dict[str, Any] = json.loads(out)[0]
    return info


def wait_for(check: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    """Poll `check` (TCG is slow, drivers probe asynchronously)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def has_netdev(dev: Path) -> bool:
    return (dev / "net").is_dir() and any((dev / "net").iterdir())


def test_guest_runs_the_repo_and_its_tools(results_dir: Path) -> None:
    assert platform.release().startswith("6.12."), platform.release()
    assert Path(sys.prefix) == REPO / ".venv"
    import meta

    assert Path(meta.__file__).is_relative_to(REPO)
    for tool in ("ip", "modprobe"):
        assert shutil.which(tool), tool
    for plugin in ("ipvlan", "vlan", "host-local", "host-device"):
        assert os.access(f"/usr/lib/cni/{plugin}", os.X_OK), plugin
    for d in (Path("/tmp"), Path("/run/netns"), Path("/var/lib/cni"), results_dir):
        d.mkdir(parents=True, exist_ok=True)
        probe = d / f".probe-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()


def test_ipvlan_moves_into_a_netns(netns: Callable[[], str]) -> None:
    node, pod = netns(), netns()
    sh("ip", "link", "add", "master0", "type", "dummy", netns=node)
    sh("ip", "link", "set", "master0", "up", netns=node)
    sh("ip", "link", "add", "ipv0", "link", "master0", "type", "ipvlan", "mode", "l2", netns=node)
    sh("ip", "link", "set", "ipv0", "netns", pod, netns=node)
    sh("ip", "addr", "add", "192.0.2.10/24", "dev", "ipv0", netns=pod)
    sh("ip", "link", "set", "ipv0", "up", netns=pod)
    info = link("ipv0", pod)
    assert info["linkinfo"]["info_kind"] == "ipvlan"
    assert info["linkinfo"]["info_data"]["mode"] == "l2"


def test_vlan_subinterface_on_dummy(netns: Callable[[], str]) -> None:
    ns = netns()
    sh("ip", "link", "add", "uplink0", "type", "dummy", netns=ns)
    sh("ip", "link", "set", "uplink0", "up", netns=ns)
    sh(
        "ip",
        "link",
        "add",
        "link",
        "uplink0",
        "name",
        "uplink0.100",
        "type",
        "vlan",
        "id",
        "100",
        netns=ns,
    )
    sh("ip", "link", "set", "uplink0.100", "up", netns=ns)
    info = link("uplink0.100", ns)
    assert info["linkinfo"]["info_kind"] == "vlan"
    assert info["linkinfo"]["info_data"]["id"] == 100


def test_igb_pf_offers_seven_vfs(igb_pf: Pf) -> None:
    assert (igb_pf.sysfs / "vendor").read_text().strip() == "0x8086"
    assert (igb_pf.sysfs / "device").read_text().strip() == "0x10c9"
    assert (igb_pf.sysfs / "driver").resolve().name == "igb"
    assert (igb_pf.sysfs / "sriov_totalvfs").read_text().strip() == "7"


def test_igb_creates_vf_netdevs(igb_pf: Pf) -> None:
    (igb_pf.sysfs / "sriov_numvfs").write_text("2")
    vfs = [(igb_pf.sysfs / f"virtfn{i}").resolve() for i in range(2)]
    for vf in vfs:
        assert (vf / "physfn").resolve() == igb_pf.sysfs.resolve()
        assert (vf / "device").read_text().strip() == "0x10ca"
        wait_for(partial(has_netdev, vf), f"a netdev on VF {vf.name}")
        assert (vf / "driver").resolve().name == "igbvf"
    sh("ip", "link", "set", igb_pf.netdev, "vf", "0", "mac", "02:00:00:00:00:01")
    assert "02:00:00:00:00:01" in sh("ip", "link", "show", igb_pf.netdev).stdout
    (igb_pf.sysfs / "sriov_numvfs").write_text("0")
    assert not (igb_pf.sysfs / "virtfn0").exists()
